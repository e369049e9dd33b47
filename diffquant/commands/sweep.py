"""`diffquant sweep CKPT [CKPT ...]`: degradation records at 16 / 8 / 6 / 4 bits on perplexity and zero-shot tasks."""

from __future__ import annotations

import argparse
import json

from .. import distributed
from ..cliargs import act_granularity, add_device_argument, chosen_device
from ..offload import add_arguments as add_dispatch_arguments
from ..offload import dispatch_options
from ..sweep import AS_STORED, ATTN_IMPLS, DEFAULT_CALIB_TOKENS, PERPLEXITY_TASKS, TARGETS
from ..tasks import SUBSETS
from . import nonfinite_exit

DEFAULT_LIMIT = 128  # windows (65,536 tokens of 512-token windows) or items per task; "all": the whole task


def limit(text: str) -> int | None:
    """``--limit``: a positive integer, or ``all`` (None: every window or item)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or all, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or all, got {value}")
    return value


def register(sub) -> None:
    p = sub.add_parser("sweep", help="quantize at several bit widths and score tasks (resumable JSONL records)")
    p.add_argument("checkpoints", nargs="+", help="checkpoint folders or .gguf files")
    p.add_argument("--target", required=True,
                   help=f"what to quantize: {' | '.join(TARGETS)} (none: the model as stored, e.g. a packed, "
                        "compressed-tensors or GGUF Q8_0/Q4_0 model, at 16 bits only)")
    p.add_argument("--bits", type=int, nargs="+", default=None,
                   help="bit widths; 16 = the unquantized model (default: 16 8 6 4; 16 for --target none)")
    p.add_argument("--granularity", default=None, type=act_granularity,
                   help="activation targets: sequence (one scale per sequence, default) | head | "
                        "head_map (per head and Diff map) | row | token")
    p.add_argument("--group-size", type=int, default=None,
                   help="weight targets: input columns per scale (default: one scale per output channel)")
    p.add_argument("--tasks", required=True,
                   help=f"comma separated: {', '.join(PERPLEXITY_TASKS)} (perplexity), a calib source or text "
                        "file (perplexity), hellaswag, arc_easy, piqa, winogrande, boolq, openbookqa, copa, "
                        "lambada, or TASK:PATH (another file in TASK's format)")
    p.add_argument("--limit", type=limit, default=DEFAULT_LIMIT,
                   help=f"N items per zero-shot task, N windows per perplexity task, or all (default: "
                        f"{DEFAULT_LIMIT}, minutes per cell on a CPU; all of HellaSwag is 10,042 items)")
    p.add_argument("--subset", choices=SUBSETS, default="first",
                   help="which --limit items: the first N, as lm-eval's --limit, or a seeded random subset "
                        "(default: first)")
    p.add_argument("--seed", type=int, default=0, help="picks the --subset random items and the GPTQ calibration "
                   "windows")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--calib-tokens", type=int, default=None,
                   help=f"GPTQ calibration tokens (default {DEFAULT_CALIB_TOKENS}), windows of max_seq_len")
    p.add_argument("--calib-data", default="train", help="GPTQ calibration text: a split, calib source or file")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer file for every checkpoint (default: each one's own; HF folders without one "
                        "need it)")
    p.add_argument("--attn-impl", default="eager", help=f"{' | '.join(ATTN_IMPLS)} (attention targets run eager)")
    add_device_argument(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", required=True,
                   help="JSONL records file (appended; finished cells are skipped; name.gz: gzip-compressed)")
    p.add_argument("--no-table", action="store_true", help="do not print the degradation table afterwards")
    add_dispatch_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..records import load_records
    from ..report import render_report
    from ..sweep import run_sweep

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = [t for t in args.tasks.split(",") if t.strip()]
    bits = args.bits or ([16] if args.target == AS_STORED else [16, 8, 6, 4])
    summary = run_sweep(args.checkpoints, args.out, args.target, bits, tasks, granularity=args.granularity,
                        group_size=args.group_size, limit=args.limit, subset=args.subset, seed=args.seed,
                        batch_size=args.batch_size,
                        calib_tokens=args.calib_tokens, calib_data=args.calib_data, attn_impl=args.attn_impl,
                        device=chosen_device(args), dispatch=dispatch_options(args), tokenizer=args.tokenizer)
    if not distributed.is_main():  # data parallel: rank 0 prints
        return 0
    if not args.no_table:
        print(render_report(load_records([args.out])))
        print()
    print(json.dumps(summary))
    return nonfinite_exit(summary["nonfinite"], summary["written"])
