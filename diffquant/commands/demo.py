"""`diffquant demo`: the main job on the shipped gated pair, in a few minutes on two CPU cores.

The shipped pair is the long xs Transformer/Diff pair of the outlier-regime campaign (experiments/RESULTS.md):
stories260K's shape, trained with identical data order on the teacher corpus at lr 3e-3 for 33.6M tokens, then
cooled for 8.4M more (41.9M), where the Transformer is in the outlier regime and Diff's λ stays in its range.
Its training log (configs, data sha256s, every loss, the outlier log) sits beside each checkpoint. On the real
TinyStories held-out text (and the held-out books):

1. The gate: the Transformer's attention-logit top-1 ≥ 100 and 4-bit per-sequence logits at least doubling its
   perplexity — without it no verdict below counts.
2. Table 5: top-1/2/3/10/100 and median of |attention logits| and |hidden states| (exact medians, where the top
   values sit), with the ratios beside the paper's, and stories260K (the real pretrained model) for scale.
3. Figure 8: attention logits at 16/8/6/4 bits with three scale granularities (per sequence, per head, per head
   and Diff map), perplexity with paired intervals against 16 bits and Diff against the Transformer, on the
   first 32 windows of each text (the campaign's verdicts use 48: ``--ppl-windows 48`` gives theirs to float
   rounding); stories260K's 16- and 4-bit perplexity beside them, the gate's reference.
4. The same for weights (RTN and GPTQ at 8/4 bits) and for 8-bit Linear inputs (the A8 of W8A8).
Tables go to the terminal; JSON records, Markdown tables and PNG plots go to ``--out``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from ..checkpoint import load_checkpoint, read_model_config, training_context
from ..corpus import heldout_ids
from ..data import calib_dir
from ..errors import UserError
from ..io import atomic_write_text
from ..kinds import ATTN_LOGITS
from ..profile import profile, token_batches
from ..study.figure8 import GRANULARITIES, sweep_pair
from ..study.gate import gate_table
from ..study.table5 import profile_pair, sites_table
from ..study.verdict import verdict
from ..tables import outlier_table, ratio_table
from ..tokenizer import tokenizer_for

log = logging.getLogger(__name__)

STORIES = "models/stories260K.gguf"  # under calib/
STORIES_WINDOWS = 4  # of 2048 tokens, quadratic attention: 16 and 4 bits ~20 s (16/8/6/4 on 12 windows: 210 s)
PPL_TASKS = ("tinystories", "test")  # real TinyStories held-out text, held-out books


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job: gate, outlier tables and degradation tables on the shipped pair")
    p.add_argument("--out", default="demo-out", help="folder for records, tables and plots")
    p.add_argument("--pair", nargs="+", default=None, metavar="NAME | TRANSFORMER DIFF",
                   help="a registered pair's name (--list; default: the shipped gated pair, xs) or the two "
                        "checkpoints of a matched pair trained with identical data order")
    p.add_argument("--list", action="store_true", help="list the registered pairs (calib/models/pairs.json) and exit")
    p.add_argument("--no-stories", action="store_true", help="skip the stories260K reference model")
    p.add_argument("--profile-windows", type=int, default=64, help="held-out windows for the outlier tables")
    p.add_argument("--ppl-windows", type=int, default=32,
                   help="perplexity windows per task and sweep cell (the campaign's verdicts use 48)")
    p.add_argument("--tasks", default=",".join(PPL_TASKS),
                   help="sweep tasks, comma separated (perplexity sets; zero-shot tasks take --limit items)")
    p.add_argument("--limit", type=int, default=100, help="items per zero-shot task")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--calib-tokens", type=int, default=8192, help="GPTQ calibration tokens")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list:
        return _list_pairs()
    started = time.time()
    out = Path(args.out)
    pair = _pair(_pair_paths(args.pair))
    out.mkdir(parents=True, exist_ok=True)
    stories = None if args.no_stories else calib_dir() / STORIES
    tasks = {t.strip(): _limit(t.strip(), args) for t in args.tasks.split(",") if t.strip()}
    table5 = _outliers(args, out, pair, stories)
    records = _degradation(args, out, pair, stories, tasks)
    mine = [r for r in records if r["checkpoint"] in {os.path.normpath(p) for p in pair["checkpoints"].values()}]
    result = verdict(pair, table5, mine) if "tinystories" in tasks else None
    if result is not None:
        text = gate_table([result]) + "\n\n" + sites_table([result])
        print("== The gate (Transformer in the outlier regime?) and where the top values sit ==\n\n" + text + "\n")
        atomic_write_text(out / "gate.md", text + "\n")
    summary = {"wall_s": round(time.time() - started, 1), "out": str(out), "verdict": result,
               "outliers": {arch: {s: v["table5"] | {"median": v["median"]} for s, v in r["sites"].items()}
                            for arch, r in table5.items()}}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    print(f"\nDone in {summary['wall_s']:.0f} s; records, tables and plots are in {out}/")
    return 0


def _list_pairs() -> int:
    from ..pairs import pair_problem, registered_pairs, registry_path

    pairs, default = registered_pairs()
    print(f"pairs registered in {registry_path()} (demo --pair NAME):")
    for name, pair in pairs.items():
        problem = pair_problem(pair)
        print(f"\n{name}{' (default)' if name == default else ''}: {pair.description}")
        for arch, path in pair.paths.items():
            print(f"  {arch:<12} {path}")
        print(f"  {'status':<12} {'ready (sha256 checked)' if problem is None else problem}")
    return 0


def _pair_paths(given: list[str] | None) -> list[str]:
    """The pair's two checkpoints: a registered name (default: the registry's default) or two paths."""
    from ..pairs import resolve_pair

    if given is not None and len(given) == 2:
        for path in given:
            if not Path(path).exists():
                raise UserError(f"model {path} not found (registered pairs: diffquant demo --list)")
        return given
    if given is not None and len(given) != 1:
        raise UserError("--pair takes a registered name or two checkpoints (TRANSFORMER DIFF)")
    pair = resolve_pair(given[0] if given else None)
    return [str(pair.paths["transformer"]), str(pair.paths["diff"])]


def _pair(paths) -> dict:
    """A study pair (diffquant.study): checkpoints by arch, training tokens from the run's log where known."""
    checkpoints = {}
    for path in paths:
        arch = read_model_config(path).arch
        if arch in checkpoints:
            raise UserError(f"--pair: both models are {arch}; give a Transformer and a Diff model")
        checkpoints[arch] = str(path)
    if set(checkpoints) != {"transformer", "diff"}:
        raise UserError(f"--pair: give a Transformer and a Diff model (got {', '.join(checkpoints)})")
    log_file = Path(checkpoints["transformer"]).parent / "train_log.json"
    tokens = json.loads(log_file.read_text()).get("tokens_seen") if log_file.is_file() else None
    family = Path(checkpoints["transformer"]).parent.name.replace("transformer", "").strip("-_")
    return {"pair": family or "pair", "tokens": tokens, "checkpoints": checkpoints}


def _seq_len(path) -> int:
    """The training context where known (stories260K: 512 of its declared 2048), else the model's."""
    return training_context(path) or read_model_config(path).max_seq_len


# -- Table 5 --------------------------------------------------------------------------------------------------

def _outliers(args, out: Path, pair: dict, stories) -> dict[str, dict]:
    print("== Outliers: the paper's Table 5 protocol (held-out TinyStories, causal logits only, both Diff maps) ==\n")
    seq_len = _seq_len(pair["checkpoints"]["transformer"])
    ids = heldout_ids(tokenizer_for(pair["checkpoints"]["transformer"]))
    table5 = profile_pair(pair, ids, seq_len, args.batch_size, args.profile_windows * seq_len)
    labelled = {r["label"]: r for r in table5.values()}
    tables = [outlier_table(labelled, paper=True), ratio_table(table5["transformer"], table5["diff"])]
    records = dict(table5)
    if stories is not None:
        stories_len = _seq_len(stories)
        batches = token_batches(heldout_ids(tokenizer_for(stories)), stories_len, args.batch_size,
                                args.profile_windows * stories_len)
        records["stories260K"] = profile(load_checkpoint(stories), batches, label="stories260K", exact_median=True,
                                         progress=False).data
        tables.append(outlier_table({"stories260K": records["stories260K"]}))
    text = "\n\n".join(tables)
    print(text + "\n")
    atomic_write_text(out / "outliers.md", text + "\n")
    atomic_write_text(out / "outliers.json", json.dumps(records, indent=1))
    from ..plots import plot_histograms, plot_layers

    plot_layers(labelled, out / "outliers-layers.png")
    plot_histograms(labelled, out / "outliers-hist.png")
    return table5


# -- Figure 8 and friends ---------------------------------------------------------------------------------------

def _degradation(args, out: Path, pair: dict, stories, tasks: dict[str, int]) -> list[dict]:
    from ..plots import plot_degradation
    from ..records import read_records
    from ..report import render_report
    from ..sweep import run_sweep

    path = out / "records.jsonl"
    checkpoints = list(pair["checkpoints"].values())
    print("== Degradation: quantized at 16 / 8 / 6 / 4 bits against the same model at 16 bits ==\n")
    sweep_pair(pair, path, tasks, batch_size=args.batch_size, granularities=GRANULARITIES)
    main_task = next(iter(tasks))
    for target, bits, extra in (("weights-rtn", (16, 8, 4), {}),
                                ("weights-gptq", (16, 8, 4), {"calib_tokens": args.calib_tokens}),
                                ("linear_inputs", (16, 8), {"granularity": "token"})):
        run_sweep(checkpoints, path, target, bits=bits, tasks=[main_task], limit=tasks[main_task],
                  batch_size=args.batch_size, progress=False, **extra)
    if stories is not None:  # the gate's reference: its 4-bit factor over a few windows of its declared context
        run_sweep([stories], path, ATTN_LOGITS, bits=(16, 4), tasks=[main_task],
                  limit=min(STORIES_WINDOWS, tasks[main_task]), batch_size=args.batch_size, progress=False)
    records = read_records(path)
    text = render_report(records, fmt="markdown")
    print(text)
    atomic_write_text(out / "degradation.md", text + "\n")
    plot_degradation([r for r in records if r.get("target") in (None, ATTN_LOGITS)], out / "figure8.png")
    return records


def _limit(task: str, args) -> int:
    """Perplexity sets are limited in rolling windows, zero-shot tasks in items."""
    return args.ppl_windows if task in ("wikitext2", "test", "validation", "tinystories") else args.limit
