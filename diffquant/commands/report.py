"""`diffquant report records.jsonl [...]`: degradation tables and Figure-8 plots from sweep records only."""

from __future__ import annotations

import argparse

from ..errors import UserError
from . import nonfinite_exit

REPORT_FORMATS = ("markdown", "csv", "latex")


def register(sub) -> None:
    p = sub.add_parser("report", help="degradation tables (Δ from 16 bits with paired 95%% intervals) and plots")
    p.add_argument("records", nargs="+", help="JSONL records files written by `diffquant sweep` (.jsonl or .jsonl.gz)")
    p.add_argument("--format", default="markdown", help=" | ".join(REPORT_FORMATS))
    p.add_argument("--metric", default=None,
                   help="comma separated metrics to show: acc, acc_norm, perplexity (default: all; the plot "
                        "defaults to acc_norm for multiple choice, acc for LAMBADA, perplexity for text)")
    p.add_argument("--plot", default=None, help="PNG: metric against bits, one line per model, one panel per task")
    p.add_argument("--pair", action="append", default=None, metavar="TRANSFORMER:OTHER",
                   help="compare only these models (labels as in the tables), repeatable; default: each Diff / "
                        "gated / clipped model with the Transformer of its matched config (same run family first)")
    p.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--out", "--output", dest="output", default=None, help="also write the table to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_write_text
    from ..plots import plot_degradation
    from ..records import is_finite, load_records
    from ..report import render_report

    if args.format not in REPORT_FORMATS:
        raise UserError(f"unknown format {args.format!r}; choose one of {', '.join(REPORT_FORMATS)}")
    metrics = [m.strip() for m in args.metric.split(",") if m.strip()] if args.metric else None
    records = load_records(args.records, compact=True)  # per-unit arrays: large files fit in memory
    text = render_report(records, args.format, metrics, n_boot=args.n_boot, seed=args.seed, pairs=_pairs(args.pair))
    print(text)
    if args.output:
        atomic_write_text(args.output, text + "\n")
    if args.plot:
        plot_degradation(records, args.plot, metrics, n_boot=args.n_boot, seed=args.seed)
    return nonfinite_exit(sum(not is_finite(r) for r in records), len(records))


def _pairs(given: list[str] | None) -> list[tuple[str, str]] | None:
    if given is None:
        return None
    pairs = []
    for text in given:
        t, sep, c = text.rpartition(":")
        if not sep or not t or not c:
            raise UserError(f"--pair {text!r}: expected TRANSFORMER:OTHER (model labels as in the tables)")
        pairs.append((t, c))
    return pairs
