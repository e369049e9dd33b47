"""PNG plots of outlier profiles, made from profile JSON records only (no model code)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .io import atomic_path  # noqa: E402
from .tables import SITE_NAMES  # noqa: E402

ARCH_COLORS = {"transformer": "tab:blue", "diff": "tab:red", "gated": "tab:green", "clipped": "tab:purple"}


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
    from .tracking import max_over_layers

    curves = {label: [(p["tokens"], max_over_layers(p["layers"], "attn_logits"), max_over_layers(p["layers"], "hidden"))
                      for p in log["history"].get("outliers", [])] for label, log in logs.items()}
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
