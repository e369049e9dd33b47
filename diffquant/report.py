"""Degradation tables and Figure-8-style plots made from sweep records only (JSON lines; no model is loaded).

A sweep (:mod:`diffquant.sweep`) writes one record per (checkpoint, quantization scheme, bits, task). Here:

* :func:`read_records` reads JSONL files (a truncated last line, left by an interrupted sweep, is skipped);
* :func:`degradation_rows` pairs every quantized record with its checkpoint's 16-bit record on the same
  task, items and windows, and computes the delta with a paired 95% bootstrap interval: over items for
  accuracies (:func:`~diffquant.evaluate.paired_bootstrap` on per-item correctness, plus the exact McNemar p),
  over windows for perplexity (:func:`~diffquant.evaluate.paired_bootstrap_ppl`; LAMBADA's perplexity is
  ``exp(-mean item log-likelihood)``, i.e. windows of one token-weight per item);
* :func:`comparison_rows` sets each other arm (Diff, gated, clipped) against its Transformer partner
  (:func:`declared_pairs`: the pairs the user names, else parameter-matched configs, preferring the same run
  family, e.g. ``diff-lr1e-3-s0`` with ``transformer-lr1e-3-s0``) at the same scheme, task and bits: the
  difference of their degradations with a joint bootstrap interval (the same items / windows in all four runs).
  It is reported as the other arm's **advantage**: positive = it lost less. For accuracy it is
  ``Δacc(other) − Δacc(Transformer)`` (:func:`~diffquant.evaluate.difference_of_degradations`); for
  perplexity, ``Δloss(Transformer) − Δloss(other)`` with ``Δloss = ln(ppl_q / ppl_16)`` in nats per token,
  which is scale-free, so models with different base perplexities compare fairly;
* :func:`render_report` prints them (markdown / latex: one wide table per scheme, columns = bits from 16 down,
  accuracies in %; csv: one tidy row per number, raw values) and :func:`plot_degradation` draws the curves.

The 16-bit record is the unquantized model and belongs to no scheme: it is the first column of every scheme's
table. Records are identified by :func:`record_key`; when a file holds the same key twice the last one wins.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tabulate import tabulate

from .config import ModelConfig
from .evaluate import (
    bootstrap_ppl_ci,
    difference_of_degradations,
    mcnemar_exact,
    paired_arrays,
    paired_bootstrap,
    paired_bootstrap_ppl,
)
from .tables import FORMATS

log = logging.getLogger(__name__)

BASELINE_BITS = 16
# What makes two records the same measurement (resuming skips a cell whose key is already in the file).
KEY_FIELDS = ("checkpoint", "target", "bits", "granularity", "group_size", "calib_tokens", "task", "limit", "subset",
              "seed", "attn_impl")
# A quantized record's baseline: the same checkpoint, data and evaluation settings at 16 bits.
BASELINE_FIELDS = ("checkpoint", "task", "limit", "subset", "seed", "attn_impl")
METRICS = {"perplexity": ("perplexity",), "multiple_choice": ("acc", "acc_norm"), "lambada": ("acc", "perplexity")}
PRIMARY_METRIC = {"perplexity": "perplexity", "multiple_choice": "acc_norm", "lambada": "acc"}
ACCURACY_KEYS = {"acc": "correct", "acc_norm": "correct_norm"}
ARCH_NAMES = {"transformer": "Transformer", "diff": "Diff", "gated": "Gated", "clipped": "Clipped"}
NONFINITE_MARK = "NaN/Inf"
CSV_HEADER = ["section", "scheme", "model", "arch", "task", "metric", "bits", "value", "delta", "low", "high",
              "p_mcnemar", "n"]


# ---------------------------------------------------------------------------------------------------- records

def record_key(rec: dict) -> tuple:
    return tuple(_hashable(_field(rec, f)) for f in KEY_FIELDS)


def baseline_key(rec: dict) -> tuple:
    return tuple(_hashable(_field(rec, f)) for f in BASELINE_FIELDS)


def _field(rec: dict, name: str):
    if name == "subset" and "subset" not in rec:  # records before `subset` existed: --limit was a seeded subset
        return "random" if rec.get("limit") is not None else None
    return rec.get(name)


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def read_records(path: str | os.PathLike, missing_ok: bool = False) -> list[dict]:
    """The records of one JSONL file, in order. A last line cut short (no newline, not JSON) is skipped with a
    warning: an interrupted writer leaves exactly that. Any other bad line is a one-line ValueError."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return []
        raise FileNotFoundError(f"records file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a JSONL records file (not UTF-8 text)") from None
    lines = text.split("\n")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):  # the unterminated last line
                log.warning("%s:%d: skipping a truncated last line (interrupted sweep?)", path, lineno)
                continue
            raise ValueError(f"{path}:{lineno}: not a JSON record") from None
        problem = record_problem(rec)
        if problem:
            raise ValueError(f"{path}:{lineno}: not a sweep record ({problem})")
        records.append(rec)
    return records


def record_problem(rec) -> str | None:
    """What makes ``rec`` unusable as a sweep record (None when it is fine): the fields the tables read."""
    if not isinstance(rec, dict) or not {"checkpoint", "bits", "task", "kind", "metrics"} <= rec.keys():
        return "needs checkpoint, bits, task, kind, metrics"
    if rec["kind"] not in METRICS or not isinstance(rec["metrics"], dict):
        return f"kind must be one of {', '.join(METRICS)} and metrics an object"
    if not isinstance(rec["bits"], int) or isinstance(rec["bits"], bool) or not isinstance(rec["checkpoint"], str):
        return "bits must be an integer and checkpoint a string"
    m = rec["metrics"]
    units = "window_losses" if rec["kind"] == "perplexity" else "items"
    if not isinstance(m.get(units), list) or not all(k in m for k in METRICS[rec["kind"]]):
        return f"metrics need {', '.join(METRICS[rec['kind']])} and {units}"
    if any(v is not None and not isinstance(v, (int, float)) for v in (m[k] for k in METRICS[rec["kind"]])):
        return "metric values must be numbers or null"
    return None


def is_finite(rec: dict) -> bool:
    """No NaN/Inf went into the record's metrics (older records may hold NaN; newer ones null + ``nonfinite``)."""
    values = [rec["metrics"][k] for k in METRICS[rec["kind"]]]
    return not rec.get("nonfinite") and all(v is not None and math.isfinite(v) for v in values)


def load_records(paths: Sequence[str | os.PathLike]) -> list[dict]:
    """Records of all files, duplicates (same :func:`record_key`) resolved in favour of the last one."""
    latest: dict[tuple, dict] = {}
    for path in paths:
        for rec in read_records(path):
            key = record_key(rec)
            if key in latest:
                log.warning("%s: a second record for %s; keeping the later one", path, key)
            latest[key] = rec
    if not latest:
        raise ValueError(f"no records in {', '.join(str(p) for p in paths)}")
    return list(latest.values())


def scheme_of(rec: dict) -> str:
    """A short name of the quantization scheme: ``attn_logits/tensor``, ``weights-gptq/g128``, ``16-bit``."""
    if rec["bits"] == BASELINE_BITS or rec.get("target") is None:
        return "16-bit"
    if rec["target"].startswith("weights"):
        return f"{rec['target']}/" + (f"g{rec['group_size']}" if rec.get("group_size") else "channel")
    return f"{rec['target']}/{rec.get('granularity') or 'tensor'}"


def model_label(rec: dict) -> str:
    return rec.get("label") or Path(rec["checkpoint"]).name


def _unique_labels(records: Sequence[dict]) -> list[dict]:
    """Records whose label is shared by two checkpoints get the checkpoint path as label (rows stay apart)."""
    owners: dict[str, set] = {}
    for r in records:
        owners.setdefault(model_label(r), set()).add(r["checkpoint"])
    return [r if len(owners[model_label(r)]) == 1 else {**r, "label": r["checkpoint"]} for r in records]


def task_label(rec: dict) -> str:
    if rec.get("limit") is None:
        return rec["task"]
    which = "first" if _field(rec, "subset") == "first" else "random"
    return f"{rec['task']} ({which} {rec['limit']})"


# ---------------------------------------------------------------------------------------------------- statistics

@dataclass
class Cell:
    """One number of a degradation table; delta/low/high/p are None at 16 bits (or without a baseline)."""

    scheme: str
    model: str
    arch: str | None
    task: str
    kind: str  # "perplexity" | "multiple_choice" | "lambada"
    metric: str
    bits: int
    value: float | None  # None: computed from NaN/Inf losses
    n: int
    delta: float | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    checkpoint: str = field(default="", repr=False)


def metric_value(rec: dict, metric: str) -> float | None:
    return float(rec["metrics"][metric]) if is_finite(rec) else None


def _n(rec: dict) -> int:
    m = rec["metrics"]
    return int(m["n"] if "n" in m else m["windows"])


def _windows(rec: dict, metric: str) -> list:
    """[sum nats, tokens] per window (LAMBADA: one window of weight 1 per item, ordered by id)."""
    if rec["kind"] == "lambada" and metric == "perplexity":
        return [[-r["ll"], 1] for r in sorted(rec["metrics"]["items"], key=lambda r: r["id"])]
    return rec["metrics"]["window_losses"]


def _check_windows(base: dict, quant: dict) -> None:
    ids_a, ids_b = base["metrics"].get("window_ids"), quant["metrics"].get("window_ids")
    if ids_a != ids_b:
        raise ValueError(f"{quant['checkpoint']} {quant['task']}: the 16-bit and {quant['bits']}-bit records "
                         "scored different windows")


def paired_delta(base: dict, quant: dict, metric: str, n_boot: int = 10000, seed: int = 0) -> dict:
    """``quant − base`` for ``metric`` with its paired interval (and McNemar p for accuracies)."""
    if metric in ACCURACY_KEYS:
        a, b = paired_arrays(base["metrics"], quant["metrics"], ACCURACY_KEYS[metric])
        out = paired_bootstrap(a, b, n=n_boot, seed=seed)
        return {"delta": out["delta"], "low": out["low"], "high": out["high"], "p": mcnemar_exact(a, b)}
    if base["kind"] == "perplexity":
        _check_windows(base, quant)
    else:
        paired_arrays(base["metrics"], quant["metrics"], "ll")  # the same item ids, or a one-line error
    out = paired_bootstrap_ppl(_windows(base, metric), _windows(quant, metric), n=n_boot, seed=seed)
    return {"delta": out["delta"], "low": out["low"], "high": out["high"], "p": None}


def _selected_metrics(rec: dict, metrics: Sequence[str] | None) -> list[str]:
    return [m for m in METRICS[rec["kind"]] if metrics is None or m in metrics]


def check_metrics(records: Iterable[dict], metrics: Sequence[str] | None) -> None:
    if metrics is None:
        return
    known = {m for rec in records for m in METRICS[rec["kind"]]}
    unknown = sorted(set(metrics) - known)
    if unknown:
        raise ValueError(f"unknown metric {', '.join(unknown)}; these records have {', '.join(sorted(known))}")


def _baselines(records: Iterable[dict]) -> dict[tuple, dict]:
    return {baseline_key(r): r for r in records if r["bits"] == BASELINE_BITS}


def degradation_rows(records: Sequence[dict], metrics: Sequence[str] | None = None, n_boot: int = 10000,
                     seed: int = 0) -> list[Cell]:
    """One :class:`Cell` per (scheme, model, task, metric, bits); 16-bit cells repeated in every scheme."""
    check_metrics(records, metrics)
    records = _unique_labels(records)
    base = _baselines(records)
    quantized = [r for r in records if r["bits"] != BASELINE_BITS]
    schemes = list(dict.fromkeys(scheme_of(r) for r in quantized)) or ["16-bit"]
    cells = []
    for scheme in schemes:
        members = [r for r in quantized if scheme_of(r) == scheme]
        # every baseline of a checkpoint/task this scheme touches (all baselines when there is no scheme)
        wanted = {baseline_key(r) for r in members} if members else set(base)
        for rec in [base[k] for k in base if k in wanted] + members:
            ref = base.get(baseline_key(rec)) if rec["bits"] != BASELINE_BITS else None
            for metric in _selected_metrics(rec, metrics):
                cell = Cell(scheme, model_label(rec), rec.get("arch"), task_label(rec), rec["kind"], metric,
                            rec["bits"], metric_value(rec, metric), _n(rec), checkpoint=rec["checkpoint"])
                if ref is not None and is_finite(ref) and is_finite(rec):
                    for k, v in paired_delta(ref, rec, metric, n_boot, seed).items():
                        setattr(cell, k, v)
                cells.append(cell)
    return cells


@dataclass
class Comparison:
    """A candidate arm (Diff, gated, clipped) against the Transformer at one scheme, task, metric and bits;
    ``advantage`` > 0: the candidate lost less."""

    scheme: str
    task: str
    metric: str
    bits: int
    transformer: str
    candidate: str
    delta_transformer: float  # accuracy: Δacc; perplexity: Δloss = ln(ppl_q / ppl_16)
    delta_candidate: float
    advantage: float
    low: float
    high: float
    n: int
    candidate_arch: str  # diff, gated or clipped


def comparison_rows(records: Sequence[dict], metrics: Sequence[str] | None = None, n_boot: int = 10000,
                    seed: int = 0, pairs: Sequence[tuple[str, str]] | None = None) -> list[Comparison]:
    """Every declared (Transformer, other arm) pair (:func:`declared_pairs`) measured at the same scheme, task
    (items), metric and quantized bits."""
    check_metrics(records, metrics)
    records = _unique_labels(records)
    partners = declared_pairs(records, pairs)
    base = _baselines(records)
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for rec in records:
        if rec["bits"] == BASELINE_BITS or rec.get("arch") not in ARCH_NAMES or baseline_key(rec) not in base:
            continue
        if not (is_finite(rec) and is_finite(base[baseline_key(rec)])):
            continue
        where = (scheme_of(rec), rec["task"], rec.get("limit"), _field(rec, "subset"), rec.get("seed"), rec["bits"])
        groups.setdefault(where, {}).setdefault(rec["arch"], []).append(rec)
    out = []
    for (scheme, *_, bits), by_arch in groups.items():
        for qt in by_arch.get("transformer", []):
            for qd in (r for arch, rs in by_arch.items() if arch != "transformer" for r in rs):
                if (model_label(qt), model_label(qd)) not in partners:
                    continue
                bt, bd = base[baseline_key(qt)], base[baseline_key(qd)]
                for metric in _selected_metrics(qt, metrics):
                    row = _compare(bt, qt, bd, qd, metric, n_boot, seed)
                    if row is not None:
                        out.append(Comparison(scheme, task_label(qt), metric, bits, model_label(qt),
                                              model_label(qd), **row, candidate_arch=qd["arch"]))
    return out


ARCH_WORDS = re.compile("|".join(ARCH_NAMES), re.IGNORECASE)


def declared_pairs(records: Sequence[dict], pairs: Sequence[tuple[str, str]] | None = None) -> set[tuple[str, str]]:
    """(Transformer label, other arm's label) pairs to compare: ``pairs`` as given (each label checked), else
    for each other-arm model the Transformers with its parameter-matched config (``ModelConfig.matched``), only
    those of the same run family (the label without its arch name) when there are any. Unrelated models (e.g.
    stories260K and a Diff trained here) are not compared unless named."""
    archs = {model_label(r): r.get("arch") for r in records}
    if pairs is not None:
        for t, c in pairs:
            if archs.get(t) != "transformer":
                raise ValueError(f"pair {t}:{c}: {t!r} is not a Transformer model in the records "
                                 f"(models: {', '.join(sorted(archs))})")
            if archs.get(c) not in set(ARCH_NAMES) - {"transformer"}:
                raise ValueError(f"pair {t}:{c}: {c!r} is not a Diff, gated or clipped model in the records "
                                 f"(models: {', '.join(sorted(archs))})")
        return set(pairs)
    configs = {model_label(r): r.get("model") for r in records}
    out = set()
    for c, arch in archs.items():
        if arch not in ARCH_NAMES or arch == "transformer":
            continue
        matched = [t for t, a in archs.items() if a == "transformer" and _matched(configs[t], configs[c])]
        family = [t for t in matched if _family(t) == _family(c)]
        out |= {(t, c) for t in (family or matched)}
        if not matched:
            log.info("%s: no Transformer with its matched config in the records; name a pair to compare it", c)
    return out


def _family(label: str) -> str:
    return ARCH_WORDS.sub("", label)


def _matched(transformer: dict | None, other: dict | None) -> bool:
    """``other``'s parameter-matched Transformer config is ``transformer`` (attention implementation aside)."""
    try:
        mine = ModelConfig.from_dict(other).matched("transformer").to_dict()
        theirs = ModelConfig.from_dict(transformer).to_dict()
    except (TypeError, ValueError, AttributeError):
        return False
    return {k: v for k, v in mine.items() if k != "attn_impl"} == {k: v for k, v in theirs.items() if k != "attn_impl"}


def _compare(bt, qt, bd, qd, metric: str, n_boot: int, seed: int) -> dict | None:
    if not _same_units([bt, qt, bd, qd]):
        log.warning("%s: the two models were scored on different items or windows (tokenizer or max_seq_len "
                    "differ); no comparison", qt["task"])
        return None
    if metric in ACCURACY_KEYS:
        key = ACCURACY_KEYS[metric]
        (a0, a1), (b0, b1) = (paired_arrays(bt["metrics"], qt["metrics"], key),
                              paired_arrays(bd["metrics"], qd["metrics"], key))
        d = difference_of_degradations(a0, a1, b0, b1, n=n_boot, seed=seed)
        return {"delta_transformer": d["delta_a"], "delta_candidate": d["delta_b"], "advantage": d["difference"],
                "low": d["low"], "high": d["high"], "n": d["n_items"]}
    windows = [np.asarray(_windows(r, metric), dtype=np.float64) for r in (bt, qt, bd, qd)]
    return _loss_advantage(*windows, n_boot=n_boot, seed=seed)


def _same_units(recs: Sequence[dict]) -> bool:
    """The runs scored the same items (by id) or, for text, the same windows of the same tokenisation."""
    def units(rec: dict):
        m = rec["metrics"]
        if "items" in m:
            return sorted(item["id"] for item in m["items"])
        return (rec.get("tokenizer_sha256"), m.get("max_len"), m.get("windows_total"), m.get("window_ids"),
                [w[1] for w in m["window_losses"]])

    first = units(recs[0])
    return all(units(r) == first for r in recs[1:])


def _loss_advantage(bt, qt, bd, qd, n_boot: int, seed: int, level: float = 0.95) -> dict:
    """``Δloss(Transformer) − Δloss(Diff)`` over windows, with a percentile bootstrap (windows resampled jointly)."""
    tokens = bt[:, 1]
    gain = (qt[:, 0] - bt[:, 0]) - (qd[:, 0] - bd[:, 0])  # nats per window the Transformer lost beyond Diff
    rng = np.random.default_rng(seed)
    m = tokens.size
    chunk = max(1, 2_000_000 // m)
    values = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, m, size=(min(chunk, n_boot - start), m))
        values.append(gain[idx].sum(1) / tokens[idx].sum(1))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(np.concatenate(values), [tail, 100 - tail])
    total = tokens.sum()
    return {"delta_transformer": float((qt[:, 0] - bt[:, 0]).sum() / total),
            "delta_candidate": float((qd[:, 0] - bd[:, 0]).sum() / total),
            "advantage": float(gain.sum() / total), "low": float(low), "high": float(high), "n": int(m)}


# ---------------------------------------------------------------------------------------------------- rendering

def _is_acc(metric: str) -> bool:
    return metric in ACCURACY_KEYS


def fixed(value: float, digits: int, signed: bool = False) -> str:
    """``value`` with about ``digits`` significant digits in fixed-point notation (never 1e+04)."""
    if not math.isfinite(value) or value == 0:
        decimals = digits - 1
    else:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def format_value(value: float, metric: str) -> str:
    """Accuracies in % with two decimals; perplexities with four significant digits."""
    return f"{100 * value:.2f}" if _is_acc(metric) else fixed(value, 4)


def format_delta(value: float, metric: str) -> str:
    return f"{100 * value:+.2f}" if _is_acc(metric) else fixed(value, 3, signed=True)


def format_cell(cell: Cell) -> str:
    """``62.50`` at 16 bits; ``61.25 (-1.25 [-4.00, +1.50], p=0.63)`` for a quantized accuracy; ``NaN/Inf``
    for a value computed from non-finite losses."""
    if cell.value is None:
        return NONFINITE_MARK
    text = format_value(cell.value, cell.metric)
    if cell.delta is None:
        return text
    inner = (f"{format_delta(cell.delta, cell.metric)} [{format_delta(cell.low, cell.metric)}, "
             f"{format_delta(cell.high, cell.metric)}]")
    if cell.p is not None:
        inner += f", p={cell.p:.2g}"
    return f"{text} ({inner})"


def _bits_columns(bits: Iterable[int]) -> list[int]:
    return sorted(set(bits), key=lambda b: (b != BASELINE_BITS, -b))


def degradation_table(cells: Sequence[Cell], fmt: str = "markdown") -> str:
    """Wide table of one scheme: rows model × task × metric, columns bits (16 first, then descending)."""
    columns = _bits_columns(c.bits for c in cells)
    rows: dict[tuple, dict[int, str]] = {}
    for c in cells:
        metric = f"{c.metric} (%)" if _is_acc(c.metric) else c.metric
        rows.setdefault((c.model, c.task, metric), {})[c.bits] = format_cell(c)
    body = [[*key, *(row.get(b) for b in columns)] for key, row in rows.items()]
    return _render(["model", "task", "metric", *[f"{b} bit" for b in columns]], body, fmt)


def comparison_table(rows: Sequence[Comparison], fmt: str = "markdown") -> str:
    body = []
    for r in rows:
        unit = f"{r.metric} (pp)" if _is_acc(r.metric) else f"{r.metric} (Δ ln ppl)"
        d = [format_advantage(v, r.metric)
             for v in (r.delta_transformer, r.delta_candidate, r.advantage, r.low, r.high)]
        body.append([r.task, unit, str(r.bits), f"{r.transformer} vs {r.candidate}", d[0], d[1],
                     f"{d[2]} [{d[3]}, {d[4]}]", str(r.n)])
    header = ["task", "metric", "bits", "models", "Transformer Δ", "other Δ", "other's advantage [95% CI]", "n"]
    return _render(header, body, fmt)


def format_advantage(value: float, metric: str) -> str:
    """Percentage points for accuracies, nats per token (4 decimals) for perplexity."""
    return f"{100 * value:+.2f}" if _is_acc(metric) else f"{value:+.4f}"


def _render(header: list[str], rows: list[list], fmt: str) -> str:
    """Cells are pre-formatted strings: tabulate must not re-parse them as numbers."""
    text = tabulate(rows, headers=header, tablefmt=FORMATS[fmt], disable_numparse=True, missingval="–")
    return text.replace("Δ", r"$\Delta$").replace("–", "--") if fmt == "latex" else text


def render_csv(header: list[str], rows: list[list]) -> str:
    """Full-precision numbers (``repr``), empty cells for None."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if c is None else repr(c) if isinstance(c, float) else c for c in row] for row in rows])
    return buf.getvalue().rstrip("\n")


def _heading(text: str, fmt: str) -> str:
    return f"% {text}" if fmt == "latex" else f"### {text}"


def render_report(records: Sequence[dict], fmt: str = "markdown", metrics: Sequence[str] | None = None,
                  n_boot: int = 10000, seed: int = 0, pairs: Sequence[tuple[str, str]] | None = None) -> str:
    """The degradation tables (one per scheme) and the Diff-vs-Transformer section, in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of markdown, csv, latex")
    bad = sum(not is_finite(r) for r in records)
    if bad:
        log.warning("%d of %d records hold NaN/Inf losses: shown as %s, without deltas or comparisons", bad,
                    len(records), NONFINITE_MARK)
    cells = degradation_rows(records, metrics, n_boot, seed)
    comparisons = comparison_rows(records, metrics, n_boot, seed, pairs)
    if fmt == "csv":
        return render_csv(CSV_HEADER, csv_rows(cells, comparisons))
    parts = []
    for scheme in dict.fromkeys(c.scheme for c in cells):
        title = f"{scheme}: value at each bit width (change from 16 bits [paired 95% CI], McNemar p)"
        parts += [_heading(title, fmt), "", degradation_table([c for c in cells if c.scheme == scheme], fmt), ""]
        mine = [r for r in comparisons if r.scheme == scheme]
        if mine:
            title = f"{scheme}: Diff vs Transformer, difference of degradations (positive = Diff lost less)"
            parts += [_heading(title, fmt), "", comparison_table(mine, fmt), ""]
    return "\n".join(parts).rstrip("\n")


def csv_rows(cells: Sequence[Cell], comparisons: Sequence[Comparison]) -> list[list]:
    """Tidy rows (raw values, accuracies as fractions; ``nan`` for values from NaN/Inf losses) under
    :data:`CSV_HEADER`."""
    rows = [["degradation", c.scheme, c.model, c.arch, c.task, c.metric, c.bits,
             math.nan if c.value is None else c.value, c.delta, c.low, c.high, c.p, c.n] for c in cells]
    rows += [["vs_transformer", r.scheme, f"{r.candidate} vs {r.transformer}", None, r.task, r.metric,
              r.bits, None, r.advantage, r.low, r.high, None, r.n] for r in comparisons]
    return rows


# ---------------------------------------------------------------------------------------------------- plots

LINESTYLES = {"transformer": "-", "diff": "--", "gated": "-.", "clipped": ":"}
MARKERS = "osD^vP*Xph"


def value_interval(rec: dict, metric: str, n_boot: int = 10000, seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of a record's own value: over items (accuracy) or windows (perplexity)."""
    if metric in ACCURACY_KEYS:
        _, correct = paired_arrays(rec["metrics"], rec["metrics"], ACCURACY_KEYS[metric])
        out = paired_bootstrap(np.zeros_like(correct), correct, n=n_boot, seed=seed)  # mean(correct − 0)
        return out["low"], out["high"]
    out = bootstrap_ppl_ci(_windows(rec, metric), n=n_boot, seed=seed)
    return out["low"], out["high"]


def plot_degradation(records: Sequence[dict], path: str | os.PathLike, metrics: Sequence[str] | None = None,
                     n_boot: int = 10000, seed: int = 0) -> Path:
    """Figure 8: metric against bits (16 → 4, left to right), one line per model (its own colour and marker;
    line style by arch), one panel per (scheme, task, metric). Error bars at quantized bits span the paired 95%
    interval of the change from 16 bits, placed at the 16-bit value plus the change's bounds; at 16 bits, the
    95% bootstrap interval of the value itself. A caption under the panels says so and names the data (items,
    windows and tokens per task). Default metrics: acc_norm for multiple choice, acc for LAMBADA, perplexity
    for text."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    from .io import atomic_path

    cells = [c for c in degradation_rows(records, metrics, n_boot, seed) if c.value is not None]
    if metrics is None:
        cells = [c for c in cells if c.metric == PRIMARY_METRIC[c.kind]]
    if not cells:
        raise ValueError("nothing to plot: no record holds finite results")
    bases = {(model_label(r), task_label(r)): r for r in _unique_labels(records)
             if r["bits"] == BASELINE_BITS and is_finite(r)}
    models = list(dict.fromkeys(c.checkpoint for c in cells))  # one colour and marker per model, in every panel
    panels = list(dict.fromkeys((c.scheme, c.task, c.metric) for c in cells))
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.6 * nrows + 0.6), squeeze=False)
    for ax, (scheme, task, metric) in zip(list(axes.flat)[:len(panels)], panels, strict=True):
        mine = [c for c in cells if (c.scheme, c.task, c.metric) == (scheme, task, metric)]
        columns = _bits_columns(c.bits for c in mine)
        here = list(dict.fromkeys(c.checkpoint for c in mine))
        for j, model in enumerate(here):
            model_cells = [c for c in mine if c.checkpoint == model]
            base = bases.get((model_cells[0].model, task))
            _plot_model(ax, model_cells, columns, models.index(model),
                        value_interval(base, metric, n_boot, seed) if base is not None else None,
                        dodge=0.05 * (j - (len(here) - 1) / 2))  # side by side: intervals do not hide each other
        scale = 100 if _is_acc(metric) else 1
        ax.set(xticks=range(len(columns)), xticklabels=[str(b) for b in columns], xlabel="bits",
               ylabel=f"{metric} (%)" if scale == 100 else metric, title=f"{task}\n{scheme}")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout(rect=(0, 0.6 / (3.6 * nrows + 0.6), 1, 1))
    fig.text(0.01, 0.005, figure_caption(list(bases.values()), n_boot), fontsize=7, va="bottom", ha="left",
             wrap=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def figure_caption(baselines: Sequence[dict], n_boot: int) -> str:
    """What the error bars are, and the data: items or windows and tokens per task (from the 16-bit records)."""
    data = {}
    for rec in baselines:
        m = rec["metrics"]
        size = (f"{m['windows']} windows, {m['tokens']:,} tokens" if rec["kind"] == "perplexity"
                else f"{m.get('n', len(m.get('items', [])))} items")
        data.setdefault(task_label(rec), size)
    return ("Error bars: 95% bootstrap intervals (" + f"{n_boot:,}" + " resamples) - at 16 bits of the value, at "
            "fewer bits of the paired change from 16 bits, drawn around the 16-bit value.  Data: "
            + "; ".join(f"{task}: {size}" for task, size in data.items()) + ".")


def _plot_model(ax, cells: Sequence[Cell], columns: list[int], i: int, base_interval, dodge: float = 0.0) -> None:
    by_bits = {c.bits: c for c in cells}
    xs = [columns.index(b) + dodge for b in columns if b in by_bits]
    pts = [by_bits[b] for b in columns if b in by_bits]
    scale = 100 if _is_acc(pts[0].metric) else 1
    ys = [scale * c.value for c in pts]
    base = by_bits.get(BASELINE_BITS)
    lower, upper = [], []
    for c, y in zip(pts, ys, strict=True):
        if c.bits == BASELINE_BITS and base_interval is not None:  # the 16-bit value's own interval
            lower.append(max(0.0, y - scale * base_interval[0]))
            upper.append(max(0.0, scale * base_interval[1] - y))
        elif c.delta is None or base is None:
            lower.append(0.0)
            upper.append(0.0)
        else:  # the interval of the delta, placed at the 16-bit value
            lower.append(max(0.0, y - scale * (base.value + c.low)))
            upper.append(max(0.0, scale * (base.value + c.high) - y))
    arch = pts[0].arch
    ax.errorbar(xs, ys, yerr=[lower, upper], color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES.get(arch, "-"), capsize=3,
                label=f"{pts[0].model} ({ARCH_NAMES.get(arch, arch or '?')})")
