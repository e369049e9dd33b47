"""Reproduce the paper's Figure 8 protocol on the shipped pair: attention logits quantized at 16/8/6/4 bits.

    python experiments/figure8.py [--scale 1.0] [--targets attn_logits,weights-rtn,weights-gptq,linear_inputs]

Dynamic post-training absmax quantization of the attention logits, one scale per sequence (the paper's
per-tensor setting as far as it is stated), scored by rolling perplexity on WikiText-2 and the held-out books
and by zero-shot accuracy (seeded item subsets; ``--scale`` multiplies every limit). Then the same grid for
weights (RTN, GPTQ) and 8-bit Linear inputs. Records go to experiments/results/figure8.jsonl.gz (resumable:
rerunning skips finished cells), tables to figure8.md, the plot to figure8.png.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from diffquant.errors import UserError
from diffquant.io import atomic_write_text
from diffquant.pairs import pair_checkpoints
from diffquant.plots import plot_degradation
from diffquant.records import read_records
from diffquant.report import render_report
from diffquant.study.figure8 import records_path
from diffquant.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
PAIR = "small-books"  # calib/models/pairs.json: parked in history, restore_states.sh brings it back
# task -> limit (rolling windows of 256 tokens for perplexity sets, items for zero-shot tasks)
TASKS = {"wikitext2": 200, "test": 200, "hellaswag": 500, "piqa": 300, "arc_easy": 300, "winogrande": 300,
         "copa": 100, "lambada": 300}
TARGETS = {
    "attn_logits": ((16, 8, 6, 4), {}),
    "weights-rtn": ((16, 8, 4), {}),
    "weights-gptq": ((16, 8, 4), {"calib_tokens": 32768}),
    "linear_inputs": ((16, 8, 6), {"granularity": "token"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every task limit")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--out", default="experiments/results")
    args = parser.parse_args()
    os.chdir(REPO)
    out = Path(args.out)
    path = records_path(out, "figure8")
    try:
        pair = pair_checkpoints(PAIR, relative_to=REPO)
    except UserError as exc:
        raise SystemExit(f"figure8.py: {exc}") from None
    for target in args.targets.split(","):
        bits, extra = TARGETS[target]
        for task in args.tasks.split(","):
            limit = max(1, round(TASKS[task] * args.scale))
            run_sweep(pair, path, target, bits=bits, tasks=[task], limit=limit, subset="random", seed=0,
                      batch_size=16, **extra)
    records = read_records(path)
    text = render_report(records, fmt="markdown")
    atomic_write_text(out / "figure8.md", f"Produced by `python experiments/figure8.py --scale {args.scale}`\n\n"
                      + text + "\n")
    plot_degradation([r for r in records if r.get("target") in (None, "attn_logits")], out / "figure8.png")
    print(text)


if __name__ == "__main__":
    main()
