"""Training throughput (forward + backward + AdamW step) of a Transformer / Diff pair, measured side by side.

    python experiments/bench_train.py [--preset xs] [--batch 16] [--seq-len 512] [--steps 6] [--compile]

One thread per process (as the training runs use: one arm per core). Steps alternate between the two archs
so machine noise hits both alike; prints the median tokens/s of each and the ratio Diff/Transformer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from diffquant import ModelConfig, build_model
from diffquant.train import TrainConfig, make_optimizer


def step_time(model, opt, x, y) -> float:
    start = time.perf_counter()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return time.perf_counter() - start


def bench(preset: str, batch: int, seq_len: int, steps: int, compile_: bool) -> dict:
    cfg = TrainConfig(tokens=batch * seq_len, batch_size=batch, seq_len=seq_len)
    runs = {}
    for arch in ("transformer", "diff"):
        model = build_model(ModelConfig.preset(preset, arch=arch, attn_impl="sdpa"), seed=0).train()
        runs[arch] = (torch.compile(model) if compile_ else model, make_optimizer(model, cfg))
    ids = torch.randint(0, 512, (batch, seq_len + 1))
    x, y = ids[:, :-1], ids[:, 1:]
    times = {arch: [] for arch in runs}
    for model, opt in runs.values():  # warm-up (and compilation)
        step_time(model, opt, x, y)
    for _ in range(steps):
        for arch, (model, opt) in runs.items():
            times[arch].append(step_time(model, opt, x, y))
    tok_s = {arch: batch * seq_len / statistics.median(t) for arch, t in times.items()}
    return {"preset": preset, "batch": batch, "seq_len": seq_len, "compile": compile_, "tokens_per_s": tok_s,
            "ratio_diff_over_transformer": tok_s["diff"] / tok_s["transformer"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", nargs="+", default=["xs", "s"])
    parser.add_argument("--batch", type=int, nargs="+", default=[16])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for preset in args.preset:
        for batch in args.batch:
            r = bench(preset, batch, args.seq_len, args.steps, args.compile)
            t = r["tokens_per_s"]
            print(f"{preset:>3} batch {batch:3d}{' compiled' if args.compile else ''}: transformer "
                  f"{t['transformer']:7.0f} tok/s   diff {t['diff']:7.0f} tok/s   diff/transformer "
                  f"{r['ratio_diff_over_transformer']:.3f}")
            print(json.dumps(r))


if __name__ == "__main__":
    main()
