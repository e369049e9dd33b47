"""The demo: the main job on one Transformer/Diff pair, in a few minutes on two CPU cores (``diffquant demo``).

On the real TinyStories held-out text (and the held-out books):

1. The gate: the Transformer's attention-logit top-1 ≥ 100 and 4-bit per-sequence logits at least doubling its
   perplexity — without it no verdict below counts.
2. Table 5: top-1/2/3/10/100 and median of |attention logits| and |hidden states| (exact medians, where the top
   values sit), with the ratios beside the paper's, and stories260K (the real pretrained model) for scale.
3. Figure 8: attention logits at 16/8/6/4 bits with three scale granularities (per sequence, per head, per head
   and Diff map), perplexity with paired intervals against 16 bits and Diff against the Transformer, on the
   first windows of each text; stories260K's 16- and 4-bit perplexity beside them, the gate's reference.
4. The same for weights (RTN and GPTQ at 8/4 bits) and for 8-bit Linear inputs (the A8 of W8A8).

:func:`run_demo` shows the tables as they are made (``show``) and writes JSON records, Markdown tables and PNG
plots to its output folder.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..checkpoint import load_checkpoint, read_model_config, training_context
from ..corpus import heldout_ids
from ..data import calib_dir
from ..errors import UserError
from ..io import atomic_write_text
from ..kinds import ATTN_LOGITS
from ..profile import profile, token_batches
from ..records import read_records
from ..report import render_report
from ..sweep import PERPLEXITY_TASKS, run_sweep
from ..tables import outlier_table, ratio_table
from ..tokenizer import tokenizer_for
from .figure8 import GRANULARITIES, sweep_pair
from .gate import gate_table
from .table5 import profile_pair, sites_table
from .verdict import verdict

log = logging.getLogger(__name__)

STORIES = "models/stories260K.gguf"  # under calib/
STORIES_WINDOWS = 4  # of 2048 tokens, quadratic attention: 16 and 4 bits ~20 s (16/8/6/4 on 12 windows: 210 s)
PPL_TASKS = ("tinystories", "test")  # real TinyStories held-out text, held-out books


def demo_tasks(names: list[str], ppl_windows: int, limit: int) -> dict[str, int]:
    """Sweep task -> its limit: rolling windows for perplexity sets, items for zero-shot tasks."""
    return {name: ppl_windows if name in PERPLEXITY_TASKS else limit for name in names}


def demo_pair(paths) -> dict:
    """A study pair (diffquant.study) of two checkpoints: by arch, training tokens from the run's log where known."""
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


def run_demo(pair: dict, out: str | Path, *, tasks: dict[str, int], stories: bool = True, profile_windows: int = 64,
             batch_size: int = 16, calib_tokens: int = 8192, show: Callable[[str], None] = log.info) -> dict:
    """The demo on ``pair`` (:func:`demo_pair`), swept on ``tasks`` (:func:`demo_tasks`), with stories260K beside
    it unless ``stories`` is false. Writes outliers.{md,json}, records.jsonl, degradation.md, gate.md,
    summary.json and the plots under ``out``; returns the summary."""
    started = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reference = calib_dir() / STORIES if stories else None
    table5 = _outliers(out, pair, reference, profile_windows, batch_size, show)
    records = _degradation(out, pair, reference, tasks, batch_size, calib_tokens, show)
    mine = [r for r in records if r["checkpoint"] in {os.path.normpath(p) for p in pair["checkpoints"].values()}]
    result = verdict(pair, table5, mine) if "tinystories" in tasks else None
    if result is not None:
        text = gate_table([result]) + "\n\n" + sites_table([result])
        show("== The gate (Transformer in the outlier regime?) and where the top values sit ==\n\n" + text + "\n")
        atomic_write_text(out / "gate.md", text + "\n")
    summary = {"wall_s": round(time.time() - started, 1), "out": str(out), "verdict": result,
               "outliers": {arch: {s: v["table5"] | {"median": v["median"]} for s, v in r["sites"].items()}
                            for arch, r in table5.items()}}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    return summary


def _seq_len(path) -> int:
    """The training context where known (stories260K: 512 of its declared 2048), else the model's."""
    return training_context(path) or read_model_config(path).max_seq_len


def _profile_reference(path: Path, profile_windows: int, batch_size: int) -> dict:
    """stories260K's Table-5 record on the held-out text, in windows of its training context."""
    seq_len = _seq_len(path)
    batches = token_batches(heldout_ids(tokenizer_for(path)), seq_len, batch_size, profile_windows * seq_len)
    return profile(load_checkpoint(path), batches, label="stories260K", exact_median=True, progress=False).data


# -- Table 5 --------------------------------------------------------------------------------------------------

def _outliers(out: Path, pair: dict, reference: Path | None, profile_windows: int, batch_size: int,
              show: Callable[[str], None]) -> dict[str, dict]:
    show("== Outliers: the paper's Table 5 protocol (held-out TinyStories, causal logits only, both Diff maps) ==\n")
    seq_len = _seq_len(pair["checkpoints"]["transformer"])
    ids = heldout_ids(tokenizer_for(pair["checkpoints"]["transformer"]))
    table5 = profile_pair(pair, ids, seq_len, batch_size, profile_windows * seq_len)
    labelled = {r["label"]: r for r in table5.values()}
    tables = [outlier_table(labelled, paper=True), ratio_table(table5["transformer"], table5["diff"])]
    records = dict(table5)
    if reference is not None:
        records["stories260K"] = _profile_reference(reference, profile_windows, batch_size)
        tables.append(outlier_table({"stories260K": records["stories260K"]}))
    text = "\n\n".join(tables)
    show(text + "\n")
    atomic_write_text(out / "outliers.md", text + "\n")
    atomic_write_text(out / "outliers.json", json.dumps(records, indent=1))
    from ..plots import plot_histograms, plot_layers

    plot_layers(labelled, out / "outliers-layers.png")
    plot_histograms(labelled, out / "outliers-hist.png")
    return table5


# -- Figure 8 and friends ---------------------------------------------------------------------------------------

def _degradation(out: Path, pair: dict, reference: Path | None, tasks: dict[str, int], batch_size: int,
                 calib_tokens: int, show: Callable[[str], None]) -> list[dict]:
    from ..plots import plot_degradation

    path = out / "records.jsonl"
    checkpoints = list(pair["checkpoints"].values())
    show("== Degradation: quantized at 16 / 8 / 6 / 4 bits against the same model at 16 bits ==\n")
    sweep_pair(pair, path, tasks, batch_size=batch_size, granularities=GRANULARITIES)
    main_task = next(iter(tasks))
    for target, bits, extra in (("weights-rtn", (16, 8, 4), {}),
                                ("weights-gptq", (16, 8, 4), {"calib_tokens": calib_tokens}),
                                ("linear_inputs", (16, 8), {"granularity": "token"})):
        run_sweep(checkpoints, path, target, bits=bits, tasks=[main_task], limit=tasks[main_task],
                  batch_size=batch_size, progress=False, **extra)
    if reference is not None:  # the gate's reference: its 4-bit factor over a few windows of its declared context
        run_sweep([reference], path, ATTN_LOGITS, bits=(16, 4), tasks=[main_task],
                  limit=min(STORIES_WINDOWS, tasks[main_task]), batch_size=batch_size, progress=False)
    records = read_records(path)
    text = render_report(records, fmt="markdown")
    show(text)
    atomic_write_text(out / "degradation.md", text + "\n")
    plot_degradation([r for r in records if r.get("target") in (None, ATTN_LOGITS)], out / "figure8.png")
    return records
