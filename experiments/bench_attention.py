"""Forward throughput of Transformer vs Diff (small preset), eager and sdpa, measured side by side.

    python experiments/bench_attention.py [--preset small] [--batch 8] [--seq-len 256] [--repeats 7]
                                          [--impls eager,sdpa] [--threads N]

Runs alternate between the two archs so machine noise hits both alike; prints the median tokens/s of each
and the ratio Diff/Transformer (the paper reports 0.88-0.95 on H100 with its custom kernel).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from diffquant import ModelConfig, build_model


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--impls", default="eager,sdpa")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
