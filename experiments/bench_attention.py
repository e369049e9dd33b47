"""Forward throughput of Transformer vs Diff (small preset), eager and sdpa, measured side by side.

    python experiments/bench_attention.py [--preset small] [--batch 8] [--seq-len 256] [--repeats 7]
                                          [--impls eager,sdpa] [--threads N] [--count-ops]

Runs alternate between the two archs so machine noise hits both alike; prints the median tokens/s of each
and the ratio Diff/Transformer (the paper reports 0.88-0.95 on H100 with its custom kernel).

``--count-ops`` instead counts, for one forward of each arch and impl, the aten ops dispatched (each is at least
one kernel launch on a GPU), the bytes their outputs write (what a memory-bound op costs), the attention calls'
multiply-adds (their q/k/v widths as dispatched, padding included) and the same for the Diff alternatives
(padded q/k in one call, the value split over two calls, an ideal fused kernel): where Diff's deficit comes from,
measured without a GPU. ``--impls triton`` counts the fused Diff kernel's path: its Triton launch is replaced by
a no-op counted as one op (the CPU cannot run it outside the interpreter), so the rest are the torch ops around it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections import Counter
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from diffquant import ModelConfig, build_model
from diffquant.kernels import available as triton_available


def time_forward(model, ids) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model(ids)
    return time.perf_counter() - start


def bench(preset: str, impl: str, batch: int, seq_len: int, repeats: int, device: str) -> dict:
    models = {arch: build_model(ModelConfig.preset(preset, arch=arch, attn_impl=impl), seed=0).to(device).eval()
              for arch in ("transformer", "diff")}
    ids = torch.randint(0, models["diff"].config.vocab_size, (batch, seq_len), device=device)
    times = {arch: [] for arch in models}
    for model in models.values():  # warm-up
        time_forward(model, ids)
    for _ in range(repeats):
        for arch, model in models.items():
            times[arch].append(time_forward(model, ids))
    tok_s = {arch: batch * seq_len / statistics.median(t) for arch, t in times.items()}
    return {"impl": impl, "tokens_per_s": tok_s, "ratio_diff_over_transformer": tok_s["diff"] / tok_s["transformer"]}


class OpCounter(TorchDispatchMode):
    """Counts aten ops that write memory (views are left out), the bytes they write, and the multiply-adds of
    attention and matmul calls."""

    def __init__(self):
        super().__init__()
        self.ops, self.bytes, self.attn_macs, self.mm_macs = Counter(), Counter(), 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        written = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                   if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs]  # views: none
        if written or not isinstance(out, torch.Tensor):
            self.ops[name] += 1  # views and reshapes launch nothing
        self.bytes[name] += sum(t.numel() * t.element_size() for t in written)
        if "scaled_dot_product" in name:
            q, k, v = args[:3]
            causal = 0.5  # the causal half of (T, S)
            self.attn_macs += int(q.numel() // q.shape[-1] * k.shape[-2] * (q.shape[-1] + v.shape[-1]) * causal)
        elif name in ("mm", "addmm", "bmm"):
            a, b = (args[1], args[2]) if name == "addmm" else args[:2]
            self.mm_macs += a.numel() * b.shape[-1]
        return out


class _StubLaunch:
    """Stands in for the fused Diff kernel's Triton launch: counts it, computes nothing."""

    def __init__(self, counter: OpCounter):
        self.counter = counter

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counter.ops["triton_diff_forward"] += 1
        return launch


@contextlib.contextmanager
def stubbed_diff_kernel(counter: OpCounter):
    """The fused Diff kernel taken on the CPU (no interpreter, no self-check) with its launch counted by
    ``counter``."""
    from diffquant.kernels import diff_attention

    with (mock.patch.object(diff_attention, "_diff_forward", _StubLaunch(counter)),
          mock.patch.object(diff_attention, "interpreted", lambda: True),
          mock.patch.object(diff_attention, "self_check", lambda *args: True)):
        yield


def count_ops(preset: str, batch: int, seq_len: int, impls: list[str]) -> dict:
    """Per arch and impl: ops, bytes written, attention and matmul multiply-adds of one forward."""
    out = {}
    for impl in impls:
        if impl == "triton" and not triton_available():
            raise SystemExit("--impls triton needs the triton package")
        for arch in ("transformer", "diff"):
            model = build_model(ModelConfig.preset(preset, arch=arch, attn_impl=impl), seed=0).eval()
            ids = torch.randint(0, model.config.vocab_size, (batch, seq_len))
            c = OpCounter()
            stub = stubbed_diff_kernel(c) if impl == "triton" else contextlib.nullcontext()
            with torch.no_grad(), stub, c:
                model(ids)
            out[f"{arch}/{impl}"] = {"ops": sum(c.ops.values()), "bytes_written": sum(c.bytes.values()),
                                     "attn_macs": c.attn_macs, "matmul_macs": c.mm_macs,
                                     "top_ops": dict(c.ops.most_common(12))}
    cfg = ModelConfig.preset(preset, arch="transformer")
    d, heads, layers = cfg.head_dim, cfg.n_heads, cfg.n_layers
    core = batch * heads * seq_len * seq_len // 2 * layers  # causal (query, key) pairs over all heads and layers
    out["attention_core_macs"] = {  # per forward, GPU widths (no CPU padding to 16)
        "transformer": core * 2 * d,
        "diff_padded_one_call": core * 2 * (2 * d),  # q/k padded to the value's 2d: both products at 2d
        "diff_value_split_two_calls": 2 * core * 2 * d,  # softmax(q kᵀ) recomputed for V1 and V2
        "diff_fused_ideal": core * (d + 2 * d),  # q kᵀ once at d, the 2d-wide value once
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--impls", default="eager,sdpa")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--count-ops", action="store_true", help="count ops, bytes and multiply-adds instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.count_ops:
        counts = count_ops(args.preset, args.batch, args.seq_len, args.impls.split(","))
        for key, c in counts.items():
            if key != "attention_core_macs":
                print(f"{key:18s} ops {c['ops']:5d}  bytes written {c['bytes_written'] / 2**20:8.1f} MiB  "
                      f"attention MACs {c['attn_macs'] / 1e6:9.1f} M  matmul MACs {c['matmul_macs'] / 1e6:9.1f} M")
        core = counts["attention_core_macs"]
        print("attention core MACs ÷ Transformer's: " + ", ".join(
            f"{k} {v / core['transformer']:.2f}" for k, v in core.items()))
        print(json.dumps(counts))
        return
    results = [bench(args.preset, impl, args.batch, args.seq_len, args.repeats, args.device)
               for impl in args.impls.split(",")]
    for r in results:
        t = r["tokens_per_s"]
        print(f"{r['impl']:>5}: transformer {t['transformer']:9.0f} tok/s   diff {t['diff']:9.0f} tok/s   "
              f"diff/transformer {r['ratio_diff_over_transformer']:.3f}")
    print(json.dumps({"preset": args.preset, "batch": args.batch, "seq_len": args.seq_len,
                      "threads": torch.get_num_threads(), "results": results}))


if __name__ == "__main__":
    main()
