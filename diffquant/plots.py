"""PNG plots made from JSON records only (no model code): outlier profiles and Figure 8 from sweep records."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

from .arches import ArchColumn  # noqa: E402
from .emergence import tracked_curve  # noqa: E402
from .io import atomic_path  # noqa: E402
from .paired import resample  # noqa: E402
from .records import BASELINE_BITS, is_finite  # noqa: E402
from .report import (  # noqa: E402
    ARCH_NAMES,
    PRIMARY_METRIC,
    Cell,
    bits_columns,
    degradation_rows,
    is_accuracy,
    model_label,
    task_label,
    unique_labels,
    value_interval_plan,
)
from .tables import SITE_NAMES  # noqa: E402

ARCH_COLORS = ArchColumn("color")  # arch -> colour (diffquant/arches.py)


def _save(fig, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def _sites(records: dict[str, dict]) -> list[str]:
    return list(dict.fromkeys(k for rec in records.values() for k in rec["sites"]))


def _color(rec: dict, i: int) -> str:
    """One colour per model (or series), so two models of the same arch stay apart."""
    return f"C{i % 10}"


def plot_layers(records: dict[str, dict], path: str | Path) -> Path:
    """Per layer: Top-1 (solid), Top-10 (dashed) and median (dotted) of |x|, log scale, one panel per site."""
    sites = _sites(records)
    fig, axes = plt.subplots(1, len(sites), figsize=(5.5 * len(sites), 4), squeeze=False)
    for ax, kind in zip(axes[0], sites, strict=True):
        for i, (label, rec) in enumerate(records.items()):
            rows = [(r["layer"], r[kind]) for r in rec["layers"] if kind in r]
            if not rows:
                continue
            xs = [layer for layer, _ in rows]
            color = _color(rec, i)
            ax.plot(xs, [s["top"][0] for _, s in rows], "-o", color=color, label=f"{label} top-1")
            ax.plot(xs, [s["top"][min(9, len(s["top"]) - 1)] for _, s in rows], "--", color=color,
                    label=f"{label} top-10")
            ax.plot(xs, [s["median"] for _, s in rows], ":", color=color, label=f"{label} median")
        ax.set(yscale="log", xlabel="layer", ylabel="|x|", title=SITE_NAMES.get(kind, kind))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_histograms(records: dict[str, dict], path: str | Path) -> Path:
    """Share of |x| values per octave [2^e, 2^(e+1)), log-log, one panel per site."""
    sites = _sites(records)
    fig, axes = plt.subplots(1, len(sites), figsize=(5.5 * len(sites), 4), squeeze=False)
    for ax, kind in zip(axes[0], sites, strict=True):
        for i, (label, rec) in enumerate(records.items()):
            hist = rec["sites"].get(kind, {}).get("log2_histogram")
            if not hist or not hist["counts"]:
                continue
            total = sum(hist["counts"]) + hist["zero"]
            xs = [2.0 ** e for e in hist["exponents"]]
            ax.step(xs, [c / total for c in hist["counts"]], where="post", color=_color(rec, i), label=label)
        ax.set(xscale="log", yscale="log", xlabel="|x| (octave lower edge)", ylabel="share of values",
               title=SITE_NAMES.get(kind, kind))
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_over_training(series: dict[str, list[dict]], path: str | Path) -> Path:
    """Top-1 / Top-10 / median against training tokens, one line per series (e.g. arch), one panel per site.

    ``series`` maps a label to profile records that carry ``train_tokens`` (from checkpoint metadata).
    """
    sites = list(dict.fromkeys(k for recs in series.values() for rec in recs for k in rec["sites"]))
    fig, axes = plt.subplots(1, len(sites), figsize=(5.5 * len(sites), 4), squeeze=False)
    for ax, kind in zip(axes[0], sites, strict=True):
        for i, (label, recs) in enumerate(series.items()):
            recs = sorted((r for r in recs if r.get("train_tokens") is not None and kind in r["sites"]),
                          key=lambda r: r["train_tokens"])
            if not recs:
                continue
            xs = [r["train_tokens"] for r in recs]
            color = _color(recs[0], i)
            ax.plot(xs, [r["sites"][kind]["top"][0] for r in recs], "-o", color=color, label=f"{label} top-1")
            ax.plot(xs, [r["sites"][kind]["top"][min(9, len(r["sites"][kind]["top"]) - 1)] for r in recs], "--",
                    color=color, label=f"{label} top-10")
            ax.plot(xs, [r["sites"][kind]["median"] for r in recs], ":", color=color, label=f"{label} median")
        ax.set(yscale="log", xlabel="training tokens", ylabel="|x|", title=SITE_NAMES.get(kind, kind))
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_tracked(logs: dict[str, dict], path: str | Path) -> Path:
    """Outliers tracked during training (``history["outliers"]`` of train logs, the maximum over layers) against
    training tokens: logit and hidden-state top-1 per arm, and the Transformer / other ratio of each.

    ``logs`` maps an arch to its train log; a continued run (a cooldown) can be passed as ``"diff cooled"`` etc.
    """
    curves = {label: tracked_curve(log) for label, log in logs.items()}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for label, pts in curves.items():
        arch = label.split()[0]
        style = "-" if label == arch else "--"
        for ax, col in zip(axes[:2], (1, 2), strict=True):
            ax.plot([p[0] for p in pts], [p[col] for p in pts], style, color=ARCH_COLORS.get(arch), label=label, lw=1.2)
    base = {p[0]: p for p in curves.get("transformer", [])}
    for label, pts in curves.items():
        if label.split()[0] == "transformer" or " " in label:
            continue
        shared = [(t, base[t][1] / lg, base[t][2] / hd) for t, lg, hd in pts if t in base and lg and hd]
        for col, style, what in ((1, "-", "logits"), (2, ":", "hidden")):
            axes[2].plot([s[0] for s in shared], [s[col] for s in shared], style, color=ARCH_COLORS.get(label),
                         label=f"Transformer / {label}, {what}")
    axes[2].axhline(1.0, color="grey", lw=0.8)
    titles = ("attention-logit top-1 (max over layers)", "hidden-state top-1 (max over layers)",
              "Transformer / other, top-1")
    for ax, title in zip(axes, titles, strict=True):
        ax.set(yscale="log", xlabel="training tokens", title=title)
        ax.legend(fontsize=7)
    return _save(fig, path)


def _sparse_log_label(value: float, _pos) -> str:
    """Minor tick label on a log axis for mantissas 2, 3 and 5 only (0.9 next to 1 and 8 next to 9 overlapped)."""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if round(mantissa) in (2, 3, 5) else ""


def plot_trend(series: dict[str, list[dict]], path: str | Path, paper: tuple[float, float] | None = None,
               scheme: str = "") -> Path:
    """The verdicts against training tokens, one line per training run: Transformer / Diff top-1 for attention
    logits and hidden states (``paper``: the paper's two ratios, drawn as references) and Diff's 4-bit advantage
    with its paired 95% interval.

    ``series`` maps a run to points ``{"tokens", "logit_ratio", "hidden_ratio", "advantage": {"advantage",
    "low", "high"} | None, "gate": bool}``; a point whose Transformer is below the gate (``gate`` False; absent
    means passed) is drawn hollow, since it counts for no verdict. ``scheme`` names the advantage's scheme and
    task for the axis title.
    """
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for i, (run, points) in enumerate(series.items()):
        points = sorted(points, key=lambda q: q["tokens"])
        style = series_style(i)
        xs = [q["tokens"] for q in points]
        axes[0].plot(xs, [q["logit_ratio"] for q in points], label=run, **style)
        axes[1].plot(xs, [q["hidden_ratio"] for q in points], **style)
        adv = [(q["tokens"], q["advantage"]) for q in points if q.get("advantage")]
        if adv:
            below = [a["advantage"] - a["low"] for _, a in adv]
            above = [a["high"] - a["advantage"] for _, a in adv]
            axes[2].errorbar([t for t, _ in adv], [a["advantage"] for _, a in adv], yerr=[below, above], capsize=3,
                             **style)
        _hollow_ungated(axes, points, style)
    for ax, ref, title in zip(axes[:2], paper or (None, None), ("attention logits", "hidden states"), strict=True):
        ax.axhline(1.0, color="grey", lw=0.8)
        if ref:
            ax.axhline(ref, color="black", ls="--", lw=0.8)
            ax.annotate(f"paper (3B): {ref:.1f}×", (0.02, ref), xycoords=("axes fraction", "data"), fontsize=7,
                        va="bottom")
        ax.set(yscale="log", ylabel="Transformer / Diff, top-1", title=title)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_sparse_log_label))
    axes[2].axhline(0.0, color="grey", lw=0.8)
    axes[2].set(ylabel="Δ ln ppl (T) − Δ ln ppl (D)", title=f"Diff's advantage at 4-bit logits ({scheme})\n"
                "> 0: Diff lost less; bars: paired 95% bootstrap over windows")
    axes[2].title.set_fontsize(9)
    budgets = sorted({q["tokens"] for points in series.values() for q in points})
    for ax in axes:
        ax.set(xscale="log", xlabel="training tokens", xticks=budgets)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:.3g}M"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)  # budgets 126M and 168M sit close on a log axis
    handles, labels = axes[0].get_legend_handles_labels()
    if any(q.get("gate") is False for points in series.values() for q in points):
        handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="none"))
        labels.append("hollow: Transformer below the gate")
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * (len(labels) // 6), 1, 1))
    return _save(fig, path)


def _hollow_ungated(axes, points: list[dict], style: dict) -> None:
    """Redraw a run's points whose Transformer is below the gate with hollow markers (over the filled ones)."""
    ungated = [q for q in points if q.get("gate") is False]
    values = (lambda q: q["logit_ratio"], lambda q: q["hidden_ratio"],
              lambda q: q["advantage"]["advantage"] if q.get("advantage") else None)
    for ax, value in zip(axes, values, strict=True):
        marked = [(q["tokens"], value(q)) for q in ungated if value(q) is not None]
        if marked:
            ax.plot(*zip(*marked, strict=True), linestyle="none", markerfacecolor="white", zorder=3, **style)


# ---------------------------------------------------------------------------------------------------- Figure 8

LINESTYLES = ArchColumn("linestyle")
MARKERS = "osD^vP*Xph"


def series_style(i: int) -> dict:
    """The colour and marker of the i-th line: the marker shifts by one each time the ten colours come round, so
    no two of the first 100 lines look alike."""
    return {"color": f"C{i % 10}", "marker": MARKERS[(i + i // 10) % len(MARKERS)]}


def plot_degradation(records: Sequence[dict], path: str | os.PathLike, metrics: Sequence[str] | None = None,
                     n_boot: int = 10000, seed: int = 0) -> Path:
    """Figure 8: metric against bits (16 → 4, left to right), one line per model (its own colour and marker;
    line style by arch), one panel per (scheme, task, metric). Error bars at quantized bits span the paired 95%
    interval of the change from 16 bits, placed at the 16-bit value plus the change's bounds; at 16 bits, the
    95% bootstrap interval of the value itself. A caption under the panels says so and names the data (items,
    windows and tokens per task). Default metrics: acc_norm for multiple choice, acc for LAMBADA, perplexity
    for text."""
    cells = [c for c in degradation_rows(records, metrics, n_boot, seed) if c.value is not None]
    if metrics is None:
        cells = [c for c in cells if c.metric == PRIMARY_METRIC[c.kind]]
    if not cells:
        raise ValueError("nothing to plot: no record holds finite results")
    bases = {(model_label(r), task_label(r)): r for r in unique_labels(records)
             if r["bits"] == BASELINE_BITS and is_finite(r)}
    intervals = _base_intervals(cells, bases, n_boot, seed)
    models = list(dict.fromkeys(c.checkpoint for c in cells))  # one colour and marker per model, in every panel
    panels = list(dict.fromkeys((c.scheme, c.task, c.metric) for c in cells))
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.6 * nrows + 0.6), squeeze=False)
    for ax, (scheme, task, metric) in zip(list(axes.flat)[:len(panels)], panels, strict=True):
        mine = [c for c in cells if (c.scheme, c.task, c.metric) == (scheme, task, metric)]
        columns = bits_columns(c.bits for c in mine)
        here = list(dict.fromkeys(c.checkpoint for c in mine))
        for j, model in enumerate(here):
            model_cells = [c for c in mine if c.checkpoint == model]
            _plot_model(ax, model_cells, columns, models.index(model), intervals.get((model_cells[0].model, task,
                        metric)), dodge=0.05 * (j - (len(here) - 1) / 2))  # side by side: intervals stay visible
        scale = 100 if is_accuracy(metric) else 1
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


def _base_intervals(cells: Sequence[Cell], bases: dict, n_boot: int, seed: int) -> dict[tuple, tuple[float, float]]:
    """(model, task, metric) -> the 95% interval of its 16-bit value, all over one set of resamples per task."""
    wanted = [k for k in dict.fromkeys((c.model, c.task, c.metric) for c in cells) if k[:2] in bases]
    results = resample([value_interval_plan(bases[k[:2]], k[2]) for k in wanted], n_boot, seed)
    return {k: (r["low"], r["high"]) for k, r in zip(wanted, results, strict=True)}


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
    scale = 100 if is_accuracy(pts[0].metric) else 1
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
    ax.errorbar(xs, ys, yerr=[lower, upper], **series_style(i),
                linestyle=LINESTYLES.get(arch, "-"), capsize=3,
                label=f"{pts[0].model} ({ARCH_NAMES.get(arch, arch or '?')})")
