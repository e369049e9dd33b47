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
  accuracies in %; csv: one tidy row per number, raw values); :func:`diffquant.plots.plot_degradation` draws
  the curves.

The 16-bit record is the unquantized model and belongs to no scheme: it is the first column of every scheme's
table. Records are identified by :func:`record_key`; when a file holds the same key twice the last one wins.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tabulate import tabulate

from .arches import ArchColumn
from .config import ModelConfig
from .kinds import SEQUENCE
from .paired import (
    Plan,
    bootstrap_ppl_ci_plan,
    difference_of_degradations_plan,
    mcnemar_exact,
    paired_arrays,
    paired_bootstrap_plan,
    paired_bootstrap_ppl_plan,
    resample,
)
from .record_arrays import ItemColumns, same_values
from .records import (
    BASELINE_BITS,
    METRICS,
    baseline_key,
    checkpoint_label,
    is_finite,
    record_field,
)
from .tables import FORMATS

log = logging.getLogger(__name__)

PRIMARY_METRIC = {"perplexity": "perplexity", "multiple_choice": "acc_norm", "lambada": "acc"}
ACCURACY_KEYS = {"acc": "correct", "acc_norm": "correct_norm"}

ARCH_NAMES = ArchColumn("label")  # arch -> "Diff" (diffquant/arches.py)
NONFINITE_MARK = "NaN/Inf"
CSV_HEADER = ["section", "scheme", "model", "arch", "task", "metric", "bits", "value", "delta", "low", "high",
              "p_mcnemar", "n"]


# ---------------------------------------------------------------------------------------------------- records

def scheme_of(rec: dict) -> str:
    """A short name of the quantization scheme: ``attn_logits/sequence``, ``weights-gptq/g128``, ``16-bit``."""
    if rec["bits"] == BASELINE_BITS or rec.get("target") is None:
        return "16-bit"
    if rec["target"].startswith("weights"):
        return f"{rec['target']}/" + (f"g{rec['group_size']}" if rec.get("group_size") else "channel")
    return f"{rec['target']}/{rec.get('granularity') or SEQUENCE}"


def model_label(rec: dict) -> str:
    """The record's checkpoint label (:func:`~diffquant.checkpoint.checkpoint_label`, stored by the sweep)."""
    return rec.get("label") or checkpoint_label(rec["checkpoint"])


def unique_labels(records: Sequence[dict]) -> list[dict]:
    """Records whose label is shared by two checkpoints get the checkpoint path as label (rows stay apart)."""
    owners: dict[str, set] = {}
    for r in records:
        owners.setdefault(model_label(r), set()).add(r["checkpoint"])
    return [r if len(owners[model_label(r)]) == 1 else {**r, "label": r["checkpoint"]} for r in records]


def task_label(rec: dict) -> str:
    if rec.get("limit") is None:
        return rec["task"]
    which = "first" if record_field(rec, "subset") == "first" else "random"
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


def _windows(rec: dict, metric: str):
    """[sum nats, tokens] per window (LAMBADA: one window of weight 1 per item, ordered by id)."""
    if rec["kind"] == "lambada" and metric == "perplexity":
        items = rec["metrics"]["items"]
        ll = items.column("ll") if isinstance(items, ItemColumns) else None
        if ll is None:
            return [[-r["ll"], 1] for r in sorted(items, key=lambda r: r["id"])]
        order = np.argsort(items.column("id"), kind="stable")  # as sorted(): equal ids keep their order
        return np.stack([-ll[order].astype(np.float64), np.ones(len(items))], 1)
    return rec["metrics"]["window_losses"]


def _check_windows(base: dict, quant: dict) -> None:
    if not same_values(base["metrics"].get("window_ids"), quant["metrics"].get("window_ids")):
        raise ValueError(f"{quant['checkpoint']} {quant['task']}: the 16-bit and {quant['bits']}-bit records "
                         "scored different windows")


def paired_delta(base: dict, quant: dict, metric: str) -> Plan:
    """``quant − base`` for ``metric`` with its paired interval (and McNemar p for accuracies), to be resampled:
    its result holds ``delta``, ``low``, ``high`` and ``p``."""
    if metric in ACCURACY_KEYS:
        a, b = paired_arrays(base["metrics"], quant["metrics"], ACCURACY_KEYS[metric])
        return _keep(paired_bootstrap_plan(a, b), p=mcnemar_exact(a, b))
    if base["kind"] == "perplexity":
        _check_windows(base, quant)
    else:
        paired_arrays(base["metrics"], quant["metrics"], "ll")  # the same item ids, or a one-line error
    return _keep(paired_bootstrap_ppl_plan(_windows(base, metric), _windows(quant, metric)), p=None)


def _keep(plan: Plan, **extra) -> Plan:
    """``plan`` whose result is only its delta and interval, plus ``extra``."""
    def finish(sums: np.ndarray) -> dict:
        out = plan.finish(sums)
        return {"delta": out["delta"], "low": out["low"], "high": out["high"], **extra}

    return Plan(plan.vectors, finish)


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
    cells, pending = _degradation_plans(records, metrics)
    return _fill_cells(cells, pending, resample([plan for _, plan in pending], n_boot, seed))


def _fill_cells(cells: list[Cell], pending: list[tuple[Cell, Plan]], results: Sequence[dict]) -> list[Cell]:
    for (cell, _), result in zip(pending, results, strict=True):
        for k, v in result.items():
            setattr(cell, k, v)
    return cells


def _degradation_plans(records: Sequence[dict], metrics: Sequence[str] | None) -> tuple[list[Cell], list]:
    """The cells of :func:`degradation_rows` and, for those with a baseline, (cell, the plan of its delta)."""
    check_metrics(records, metrics)
    records = unique_labels(records)
    base = _baselines(records)
    quantized = [r for r in records if r["bits"] != BASELINE_BITS]
    schemes = list(dict.fromkeys(scheme_of(r) for r in quantized)) or ["16-bit"]
    cells, pending = [], []
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
                    pending.append((cell, paired_delta(ref, rec, metric)))
                cells.append(cell)
    return cells, pending


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
    pending = _comparison_plans(records, metrics, pairs)
    results = resample([plan for _, plan in pending], n_boot, seed)
    return [Comparison(**known, **result) for (known, _), result in zip(pending, results, strict=True)]


def _comparison_plans(records: Sequence[dict], metrics: Sequence[str] | None,
                      pairs: Sequence[tuple[str, str]] | None) -> list[tuple[dict, Plan]]:
    """(the fields of a :class:`Comparison` known before resampling, the plan of the rest) per comparison."""
    check_metrics(records, metrics)
    records = unique_labels(records)
    partners = declared_pairs(records, pairs)
    base = _baselines(records)
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for rec in records:
        if rec["bits"] == BASELINE_BITS or rec.get("arch") not in ARCH_NAMES or baseline_key(rec) not in base:
            continue
        if not (is_finite(rec) and is_finite(base[baseline_key(rec)])):
            continue
        where = (scheme_of(rec), rec["task"], rec.get("limit"), record_field(rec, "subset"), rec.get("seed"),
                 rec["bits"])
        groups.setdefault(where, {}).setdefault(rec["arch"], []).append(rec)
    out = []
    for (scheme, *_, bits), by_arch in groups.items():
        for qt in by_arch.get("transformer", []):
            for qd in (r for arch, rs in by_arch.items() if arch != "transformer" for r in rs):
                if (model_label(qt), model_label(qd)) not in partners:
                    continue
                bt, bd = base[baseline_key(qt)], base[baseline_key(qd)]
                for metric in _selected_metrics(qt, metrics):
                    plan = _compare(bt, qt, bd, qd, metric)
                    if plan is not None:
                        known = {"scheme": scheme, "task": task_label(qt), "metric": metric, "bits": bits,
                                 "transformer": model_label(qt), "candidate": model_label(qd),
                                 "candidate_arch": qd["arch"]}
                        out.append((known, plan))
    return out


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
    return re.compile("|".join(ARCH_NAMES), re.IGNORECASE).sub("", label)


def _matched(transformer: dict | None, other: dict | None) -> bool:
    """``other``'s parameter-matched Transformer config is ``transformer`` (attention implementation aside)."""
    try:
        mine = ModelConfig.from_dict(other).matched("transformer").to_dict()
        theirs = ModelConfig.from_dict(transformer).to_dict()
    except (TypeError, ValueError, AttributeError):
        return False
    return {k: v for k, v in mine.items() if k != "attn_impl"} == {k: v for k, v in theirs.items() if k != "attn_impl"}


def _compare(bt, qt, bd, qd, metric: str) -> Plan | None:
    if not _same_units([bt, qt, bd, qd]):
        log.warning("%s: the two models were scored on different items or windows (tokenizer or max_seq_len "
                    "differ); no comparison", qt["task"])
        return None
    if metric in ACCURACY_KEYS:
        key = ACCURACY_KEYS[metric]
        (a0, a1), (b0, b1) = (paired_arrays(bt["metrics"], qt["metrics"], key),
                              paired_arrays(bd["metrics"], qd["metrics"], key))
        plan = difference_of_degradations_plan(a0, a1, b0, b1)

        def finish(sums: np.ndarray) -> dict:
            d = plan.finish(sums)
            return {"delta_transformer": d["delta_a"], "delta_candidate": d["delta_b"],
                    "advantage": d["difference"], "low": d["low"], "high": d["high"], "n": d["n_items"]}

        return Plan(plan.vectors, finish)
    windows = [np.asarray(_windows(r, metric), dtype=np.float64) for r in (bt, qt, bd, qd)]
    return _loss_advantage(*windows)


def _same_units(recs: Sequence[dict]) -> bool:
    """The runs scored the same items (by id) or, for text, the same windows of the same tokenisation."""
    def units(rec: dict):
        m = rec["metrics"]
        if "items" in m:
            items = m["items"]
            ids = items.column("id") if isinstance(items, ItemColumns) else None
            return np.sort(ids) if ids is not None else sorted(item["id"] for item in items)
        return (rec.get("tokenizer_sha256"), m.get("max_len"), m.get("windows_total"), m.get("window_ids"),
                np.asarray(m["window_losses"], dtype=np.float64).reshape(-1, 2)[:, 1])

    first = units(recs[0])
    return all(_same(units(r), first) for r in recs[1:])


def _same(a, b) -> bool:
    """Equal unit descriptions: tuples field by field, lists and arrays value by value."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (list, np.ndarray)) or isinstance(b, (list, np.ndarray)):
        return same_values(a, b)
    return a == b


def _loss_advantage(bt, qt, bd, qd, level: float = 0.95) -> Plan:
    """``Δloss(Transformer) − Δloss(Diff)`` over windows, with a percentile bootstrap (windows resampled jointly)."""
    tokens = bt[:, 1]
    gain = (qt[:, 0] - bt[:, 0]) - (qd[:, 0] - bd[:, 0])  # nats per window the Transformer lost beyond Diff
    total = tokens.sum()

    def finish(sums: np.ndarray) -> dict:
        tail = (1 - level) / 2 * 100
        low, high = np.percentile(sums[:, 0] / sums[:, 1], [tail, 100 - tail])
        return {"delta_transformer": float((qt[:, 0] - bt[:, 0]).sum() / total),
                "delta_candidate": float((qd[:, 0] - bd[:, 0]).sum() / total),
                "advantage": float(gain.sum() / total), "low": float(low), "high": float(high),
                "n": int(tokens.size)}

    return Plan(np.stack([gain, tokens], 1), finish)


# ---------------------------------------------------------------------------------------------------- rendering

def is_accuracy(metric: str) -> bool:
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
    return f"{100 * value:.2f}" if is_accuracy(metric) else fixed(value, 4)


def format_delta(value: float, metric: str) -> str:
    return f"{100 * value:+.2f}" if is_accuracy(metric) else fixed(value, 3, signed=True)


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


def bits_columns(bits: Iterable[int]) -> list[int]:
    return sorted(set(bits), key=lambda b: (b != BASELINE_BITS, -b))


def degradation_table(cells: Sequence[Cell], fmt: str = "markdown") -> str:
    """Wide table of one scheme: rows model × task × metric, columns bits (16 first, then descending)."""
    columns = bits_columns(c.bits for c in cells)
    rows: dict[tuple, dict[int, str]] = {}
    for c in cells:
        metric = f"{c.metric} (%)" if is_accuracy(c.metric) else c.metric
        rows.setdefault((c.model, c.task, metric), {})[c.bits] = format_cell(c)
    body = [[*key, *(row.get(b) for b in columns)] for key, row in rows.items()]
    return _render(["model", "task", "metric", *[f"{b} bit" for b in columns]], body, fmt)


def comparison_table(rows: Sequence[Comparison], fmt: str = "markdown") -> str:
    body = []
    for r in rows:
        unit = f"{r.metric} (pp)" if is_accuracy(r.metric) else f"{r.metric} (Δ ln ppl)"
        d = [format_advantage(v, r.metric)
             for v in (r.delta_transformer, r.delta_candidate, r.advantage, r.low, r.high)]
        body.append([r.task, unit, str(r.bits), f"{r.transformer} vs {r.candidate}", d[0], d[1],
                     f"{d[2]} [{d[3]}, {d[4]}]", str(r.n)])
    header = ["task", "metric", "bits", "models", "Transformer Δ", "other Δ", "other's advantage [95% CI]", "n"]
    return _render(header, body, fmt)


def format_advantage(value: float, metric: str) -> str:
    """Percentage points for accuracies, nats per token (4 decimals) for perplexity."""
    return f"{100 * value:+.2f}" if is_accuracy(metric) else f"{value:+.4f}"


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
    cells, comparisons = report_rows(records, metrics, n_boot, seed, pairs)
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


def report_rows(records: Sequence[dict], metrics: Sequence[str] | None = None, n_boot: int = 10000, seed: int = 0,
                pairs: Sequence[tuple[str, str]] | None = None) -> tuple[list[Cell], list[Comparison]]:
    """:func:`degradation_rows` and :func:`comparison_rows` over one set of resamples per task."""
    cells, pending = _degradation_plans(records, metrics)
    compared = _comparison_plans(records, metrics, pairs)
    results = resample([plan for _, plan in pending] + [plan for _, plan in compared], n_boot, seed)
    comparisons = [Comparison(**known, **result)
                   for (known, _), result in zip(compared, results[len(pending):], strict=True)]
    return _fill_cells(cells, pending, results[:len(pending)]), comparisons


def csv_rows(cells: Sequence[Cell], comparisons: Sequence[Comparison]) -> list[list]:
    """Tidy rows (raw values, accuracies as fractions; ``nan`` for values from NaN/Inf losses) under
    :data:`CSV_HEADER`."""
    rows = [["degradation", c.scheme, c.model, c.arch, c.task, c.metric, c.bits,
             math.nan if c.value is None else c.value, c.delta, c.low, c.high, c.p, c.n] for c in cells]
    rows += [["vs_transformer", r.scheme, f"{r.candidate} vs {r.transformer}", None, r.task, r.metric,
              r.bits, None, r.advantage, r.low, r.high, None, r.n] for r in comparisons]
    return rows


# ---------------------------------------------------------------------------------------------------- plots

def value_interval(rec: dict, metric: str, n_boot: int = 10000, seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of a record's own value: over items (accuracy) or windows (perplexity)."""
    out = resample([value_interval_plan(rec, metric)], n_boot, seed)[0]
    return out["low"], out["high"]


def value_interval_plan(rec: dict, metric: str) -> Plan:
    """:func:`value_interval` to be resampled (its result holds ``low`` and ``high``)."""
    if metric in ACCURACY_KEYS:
        _, correct = paired_arrays(rec["metrics"], rec["metrics"], ACCURACY_KEYS[metric])
        return paired_bootstrap_plan(np.zeros_like(correct), correct)  # mean(correct − 0)
    return bootstrap_ppl_ci_plan(_windows(rec, metric))
