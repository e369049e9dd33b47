"""`diffquant demo`: the main job on the shipped models, in about ten minutes on two CPU cores.

1. Table-5 protocol: top-1/2/3/10/100 and median of |attention logits| and |hidden states| for the shipped
   Transformer/Diff pair (and stories260K), side by side with ratios and the paper's numbers.
2. Figure-8 protocol: attention logits quantized at 16/8/6/4 bits (dynamic absmax, per sequence), scored by
   perplexity and zero-shot accuracy, with paired intervals against 16 bits and Diff-vs-Transformer.
3. The same for weights (RTN and GPTQ at 8/4 bits) and for 8-bit Linear inputs (the A8 of W8A8).
Tables go to the terminal; JSON records, Markdown tables and PNG plots go to ``--out``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from ..checkpoint import load_checkpoint
from ..data import calib_dir, documents, encode_documents
from ..errors import UserError
from ..io import atomic_write_text
from ..kinds import ATTN_LOGITS
from ..profile import profile, token_batches
from ..records import checkpoint_label
from ..tables import outlier_table, ratio_table
from ..tokenizer import tokenizer_for

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
PAIR = (REPO / "experiments/checkpoints/transformer-small/final", REPO / "experiments/checkpoints/diff-small/final")
STORIES = "models/stories260K.gguf"  # under calib/


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job: outlier tables and degradation tables on the shipped models")
    p.add_argument("--out", default="demo-out", help="folder for records, tables and plots")
    p.add_argument("--pair", nargs=2, default=[str(p) for p in PAIR], metavar=("TRANSFORMER", "DIFF"),
                   help="the matched pair (default: the shipped small pair)")
    p.add_argument("--no-stories", action="store_true", help="skip the stories260K model")
    p.add_argument("--profile-tokens", type=int, default=65_536, help="held-out tokens for the outlier tables")
    p.add_argument("--ppl-windows", type=int, default=32, help="rolling windows per perplexity set")
    p.add_argument("--limit", type=int, default=100, help="items per zero-shot task")
    p.add_argument("--tasks", default="test,wikitext2,hellaswag", help="sweep tasks, comma separated")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--calib-tokens", type=int, default=8192, help="GPTQ calibration tokens")
    p.set_defaults(func=run)


def run(args) -> int:
    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in args.pair:
        if not Path(path).exists():
            raise UserError(f"model {path} not found (the shipped pair lives in experiments/checkpoints/)")
    stories = None if args.no_stories else calib_dir() / STORIES
    outliers = _outliers(args, out, stories)
    degradation = _degradation(args, out, stories)
    summary = {"wall_s": round(time.time() - started, 1), "out": str(out), **outliers, **degradation}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    print(f"\nDone in {summary['wall_s']:.0f} s; records, tables and plots are in {out}/")
    return 0


# -- 1. Table 5 -----------------------------------------------------------------------------------------------

def _profile(path, data: str, tokens: int, batch_size: int, seq_len: int = 256) -> dict:
    """256-token windows for every model: the pair's context, and within stories260K's training context."""
    model = load_checkpoint(path)
    tok = tokenizer_for(path)
    seq_len = min(seq_len, model.config.max_seq_len)
    batches = token_batches(encode_documents(tok, documents(data)), seq_len, batch_size, tokens)
    record = profile(model, batches, label=checkpoint_label(path)).data
    record.update(checkpoint=str(path), data=data, seq_len=seq_len)
    return record


def _outliers(args, out: Path, stories) -> dict:
    print("== Outliers: the paper's Table 5 protocol (held-out text, causal logits only, both Diff maps) ==\n")
    tr, diff = (_profile(p, "test", args.profile_tokens, args.batch_size) for p in args.pair)
    records = {"transformer": tr, "diff": diff}
    tables = [outlier_table({tr["label"]: tr, diff["label"]: diff}, paper=True), ratio_table(tr, diff)]
    if stories is not None:
        real = _profile(stories, "tinystories-cased", args.profile_tokens, args.batch_size)
        records["stories260K"] = real
        tables.append(outlier_table({"stories260K": real}))
    text = "\n\n".join(tables)
    print(text + "\n")
    atomic_write_text(out / "outliers.md", text + "\n")
    atomic_write_text(out / "outliers.json", json.dumps(records, indent=1))
    from ..plots import plot_histograms, plot_layers

    plot_layers({tr["label"]: tr, diff["label"]: diff}, out / "outliers-layers.png")
    plot_histograms({tr["label"]: tr, diff["label"]: diff}, out / "outliers-hist.png")
    return {"outliers": {k: {s: v["table5"] | {"median": v["median"]} for s, v in r["sites"].items()}
                         for k, r in records.items()}}


# -- 2 and 3. Figure 8 and friends ---------------------------------------------------------------------------

def _degradation(args, out: Path, stories) -> dict:
    from ..plots import plot_degradation
    from ..records import read_records
    from ..report import render_report
    from ..sweep import run_sweep

    records_path = out / "records.jsonl"
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    common = {"batch_size": args.batch_size}
    plan = [
        (ATTN_LOGITS, (16, 8, 6, 4), {}),
        ("weights-rtn", (16, 8, 4), {}),
        ("weights-gptq", (16, 8, 4), {"calib_tokens": args.calib_tokens}),
        ("linear_inputs", (16, 8), {"granularity": "token"}),
    ]
    print("== Degradation: quantized at 16 / 8 / 6 / 4 bits against the same model at 16 bits ==\n")
    for target, bits, extra in plan:
        for task in tasks:
            run_sweep(args.pair, records_path, target, bits=bits, tasks=[task], limit=_limit(task, args),
                      seed=0, **common, **extra)
    if stories is not None:
        # its GGUF declares a 2048-token context: the same token budget as the pair means fewer windows
        windows = max(2, args.ppl_windows * 256 // load_checkpoint(stories).config.max_seq_len)
        for task, limit in (("tinystories", windows), ("hellaswag", args.limit)):
            run_sweep([stories], records_path, ATTN_LOGITS, bits=(16, 8, 6, 4), tasks=[task], limit=limit,
                      seed=0, **common)
    records = read_records(records_path)
    text = render_report(records, fmt="markdown")
    print(text)
    atomic_write_text(out / "degradation.md", text + "\n")
    plot_degradation([r for r in records if r.get("target") in (None, ATTN_LOGITS)], out / "figure8.png")
    return {"degradation_records": str(records_path)}


def _limit(task: str, args) -> int:
    """Perplexity sets are limited in rolling windows, zero-shot tasks in items."""
    return args.ppl_windows if task in ("wikitext2", "test", "validation", "tinystories") else args.limit
