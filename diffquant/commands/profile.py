"""`diffquant profile CKPT [CKPT ...]`: Table-5 outlier statistics, locations, JSON and plots."""

from __future__ import annotations

import json
from pathlib import Path

from .. import distributed
from ..cliargs import add_device_argument, chosen_device, hist_plot_path
from ..errors import UserError
from ..io import atomic_write_text
from ..offload import add_arguments as add_dispatch_arguments
from ..offload import dispatch_options
from ..profile import DEFAULT_SITES, PROTOCOLS
from ..profile_checkpoint import PAPER_TOKENS, profile_checkpoint
from ..records import checkpoint_label
from ..tables import FORMATS, outlier_table, ratio_table
from . import nonfinite_exit

DEFAULT_TOKENS = 65_536  # 128 windows of 512: minutes, not the paper's half hour, for a 260K pair on 2 CPU cores


def register(sub) -> None:
    p = sub.add_parser("profile", help="exact top-k / median of |activations| (the paper's Table 5)")
    p.add_argument("checkpoints", nargs="+", help="checkpoint folders or .gguf files")
    p.add_argument("--data", default="test", help="split (train|validation|test), calib source or text file")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                   help=f"tokens to profile (default: {DEFAULT_TOKENS:,}; the paper's protocol: {PAPER_TOKENS})")
    p.add_argument("--seq-len", type=int, default=None,
                   help="window length; default: the training context where known (a run's train_log.json, "
                        "stories260K: 512), else the model's max_seq_len")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--topk", type=int, default=100)
    p.add_argument("--sites", default=",".join(DEFAULT_SITES), help="probe kinds, comma separated")
    p.add_argument("--protocol", choices=PROTOCOLS, default="global")
    p.add_argument("--exact-median", action="store_true", help="second pass: exact fp32 medians")
    p.add_argument("--chunk", type=int, default=None, help="eager attention query-chunk size (long inputs)")
    p.add_argument("--tokenizer", default=None, help="override the checkpoint's tokenizer")
    p.add_argument("--out", "--json", dest="json", default=None,
                   help="JSON file for the records (a list, one per checkpoint); --json is the old name")
    p.add_argument("--plot", default=None, help="PNG: per-layer top-1/top-10/median (+ -hist.png histograms)")
    p.add_argument("--training-plot", default=None, help="PNG: statistics against training tokens, per arch")
    p.add_argument("--format", choices=sorted(FORMATS), default="markdown")
    add_device_argument(p)
    add_dispatch_arguments(p)
    p.set_defaults(func=run)


def profile_options(args) -> dict:
    """``profile_checkpoint`` keyword arguments from the parsed flags."""
    return {"data": args.data, "tokens": args.tokens, "seq_len": args.seq_len, "batch_size": args.batch_size,
            "topk": args.topk, "sites": tuple(s.strip() for s in args.sites.split(",") if s.strip()),
            "protocol": args.protocol, "exact_median": args.exact_median, "chunk": args.chunk,
            "tokenizer": args.tokenizer, "device": chosen_device(args), "dispatch": dispatch_options(args)}


def windows_caption(records: list[dict]) -> str:
    """One line per model: window length (and its source) and the tokens actually profiled of those asked for."""
    lines = []
    for rec in records:
        asked = rec.get("tokens_requested")
        of = f" of {asked:,} requested (whole windows only)" if asked and asked != rec["tokens"] else ""
        lines.append(f"{rec['label']}: {rec['tokens']:,} tokens profiled{of}, in {rec['tokens'] // rec['seq_len']:,} "
                     f"windows of {rec['seq_len']} ({rec['seq_len_source']})")
    return "\n".join(lines)


def run(args) -> int:
    labels = [checkpoint_label(path) for path in args.checkpoints]
    if len(set(labels)) < len(labels):
        raise UserError("two checkpoints have the same label; give them distinct folder names")
    options = profile_options(args)
    records = [profile_checkpoint(path, **options) for path in args.checkpoints]
    if not distributed.is_main():  # data parallel: rank 0 prints and writes
        return 0
    by_label = {rec["label"]: rec for rec in records}
    print(outlier_table(by_label, fmt=args.format, paper=len(records) <= 2))
    if args.format != "csv":
        print()
        print(windows_caption(records))
    archs = {rec["model"].get("arch"): rec for rec in records}
    if len(records) == 2 and set(archs) == {"transformer", "diff"}:
        print()
        print(ratio_table(archs["transformer"], archs["diff"], fmt=args.format))
    if args.json:
        atomic_write_text(args.json, json.dumps(records, indent=1))
    if args.plot or args.training_plot:
        from ..plots import plot_histograms, plot_layers, plot_over_training

        if args.plot:
            plot_layers(by_label, args.plot)
            plot_histograms(by_label, Path(hist_plot_path(args.plot)))
        if args.training_plot:
            series: dict[str, list[dict]] = {}
            for rec in records:
                series.setdefault(rec["model"].get("arch", "model"), []).append(rec)
            plot_over_training(series, args.training_plot)
    sites = [site for rec in records for site in rec["sites"].values()]
    return nonfinite_exit(sum(_all_nonfinite(site) for site in sites), len(sites))


def _all_nonfinite(site: dict) -> bool:
    """Every entry of the site was NaN or Inf: its statistics are empty."""
    return not site.get("count") and bool(site.get("nan") or site.get("inf"))

