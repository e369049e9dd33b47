"""What flushing denormals to zero buys a training step of an outlier-regime model, measured side by side.

    python experiments/bench_denormal.py CHECKPOINT [CHECKPOINT ...] [--data experiments/corpus/stories260k-s0]
        [--batch 16] [--seq-len 512] [--steps 4]

CHECKPOINT: a checkpoint folder, a run's ``state/`` or a branch. Forward + backward (no optimizer step, so the
weights stay put) on the corpus's first batch, one thread, steps alternating between torch's default and
``torch.set_flush_denormal(True)`` (what ``diffquant train`` sets) so machine noise hits both alike. Prints the
median seconds per step of each, their ratio, and both losses (flushing moves nothing above 1.2e-38, so they
should agree). Models with logits in the hundreds put softmax and its gradients in the denormal range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from diffquant import load_checkpoint
from diffquant.corpus import load_corpus


def load_model(path: Path):
    return load_checkpoint(path / "model" if (path / "trainer.json").is_file() else path).train()


def step(model, x, y, flush: bool) -> tuple[float, float]:
    torch.set_flush_denormal(flush)
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
    loss.backward()
    return time.perf_counter() - start, loss.item()


def bench(path: Path, ids: torch.Tensor, steps: int) -> dict:
    model = load_model(path)
    x, y = ids[:, :-1], ids[:, 1:]
    times, losses = {False: [], True: []}, {}
    for flush in (False, True):  # warm-up
        step(model, x, y, flush)
    for _ in range(steps):
        for flush in (False, True):
            seconds, losses[flush] = step(model, x, y, flush)
            times[flush].append(seconds)
    torch.set_flush_denormal(False)
    median = {flush: statistics.median(t) for flush, t in times.items()}
    return {"checkpoint": str(path), "s_per_step_default": median[False], "s_per_step_flushed": median[True],
            "speedup": median[False] / median[True], "loss_default": losses[False], "loss_flushed": losses[True]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--data", default="experiments/corpus/stories260k-s0")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ids = load_corpus(args.data, verify=False).ids[: args.batch * (args.seq_len + 1)]
    ids = torch.from_numpy(ids.astype("int64")).view(args.batch, args.seq_len + 1)
    for path in args.checkpoints:
        print(json.dumps(bench(path, ids, args.steps)))


if __name__ == "__main__":
    main()
