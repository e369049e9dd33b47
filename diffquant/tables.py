"""Tables in the paper's Table-5 form, made from profile JSON records only (pure: no model, no torch)."""

from __future__ import annotations

from collections import ChainMap

from tabulate import tabulate

from .arches import PROBE_NAMES
from .kinds import ATTN_K, ATTN_LOGITS, ATTN_PROBS, ATTN_Q, HIDDEN, MLP_ACT

TABLE5_RANKS = (1, 2, 3, 10, 100)
# every arch's sites, then the probes an arch adds (its row in diffquant/arches.py names them), read live
SITE_NAMES = ChainMap({ATTN_LOGITS: "attention logits", HIDDEN: "hidden states", MLP_ACT: "MLP activations",
                       ATTN_PROBS: "attention probs", ATTN_Q: "queries", ATTN_K: "keys"}, PROBE_NAMES)
FORMATS = {"markdown": "github", "github": "github", "csv": "csv", "latex": "latex", "plain": "plain"}

# The paper's Table 5 (3B models, 0.4M tokens): reference values printed beside our measurements.
PAPER_TABLE5 = {
    ("transformer", ATTN_LOGITS): (318.0, 308.2, 304.9, 284.7, 251.5, 5.4),
    ("diff", ATTN_LOGITS): (38.8, 38.8, 37.3, 32.0, 27.4, 3.3),
    ("transformer", HIDDEN): (3608.6, 3607.4, 3603.6, 3552.1, 2448.2, 0.6),
    ("diff", HIDDEN): (1688.2, 1672.5, 1672.1, 1624.3, 740.9, 1.2),
}
HEADER = [f"Top-{r}" for r in TABLE5_RANKS] + ["Median"]


def table5_row(site: dict, per_sequence: bool = False) -> list[float | None]:
    """Top-1/2/3/10/100 and the median of one site's record."""
    src = site["per_sequence"] if per_sequence else site
    top = src.get("top", [])
    return [top[r - 1] if len(top) >= r else None for r in TABLE5_RANKS] + [src.get("median")]


def outlier_table(records: dict[str, dict], fmt: str = "markdown", sites=None, per_sequence: bool = False,
                  paper: bool = False) -> str:
    """One row per (model, site); with ``paper`` the paper's row for the same arch and site follows.
    NaN and Inf columns (entries left out of every statistic) appear when any site has such entries; a
    kurtosis column (mean over tokens, Bondarenko et al.'s outlier metric) when any site has it."""
    chosen = [(label, rec, kind, site) for label, rec in records.items() for kind, site in rec["sites"].items()
              if not sites or kind in sites]
    counts = any(site.get("nan") or site.get("inf") for *_, site in chosen)
    kurtosis = any("kurtosis" in site for *_, site in chosen)
    extra = ["NaN", "Inf"] * counts + ["Kurtosis"] * kurtosis
    rows = []
    for label, rec, kind, site in chosen:
        found = [site.get("nan", 0), site.get("inf", 0)] if counts else []
        if kurtosis:
            found.append(site.get("kurtosis", {}).get("mean"))
        rows.append([label, SITE_NAMES.get(kind, kind), *table5_row(site, per_sequence), *found])
        arch = rec.get("model", {}).get("arch")
        if paper and (arch, kind) in PAPER_TABLE5:
            rows.append([f"paper 3B {arch}", SITE_NAMES[kind], *PAPER_TABLE5[(arch, kind)], *[None] * len(extra)])
    return render(["model", "site", *HEADER, *extra], rows, fmt)


def ratio_table(base: dict, other: dict, base_label: str = "Transformer", other_label: str = "Diff",
                fmt: str = "markdown", per_sequence: bool = False, paper: bool = True) -> str:
    """``base`` and ``other`` side by side per site with the ratio base/other (the paper's reading)."""
    rows = []
    for kind in base["sites"]:
        if kind not in other["sites"]:
            continue
        a, b = table5_row(base["sites"][kind], per_sequence), table5_row(other["sites"][kind], per_sequence)
        name = SITE_NAMES.get(kind, kind)
        rows.append([name, base_label, *a])
        rows.append([name, other_label, *b])
        rows.append([name, f"{base_label}/{other_label}", *[_ratio(x, y) for x, y in zip(a, b, strict=True)]])
        if paper and ("transformer", kind) in PAPER_TABLE5:
            pa, pb = PAPER_TABLE5[("transformer", kind)], PAPER_TABLE5[("diff", kind)]
            rows.append([name, "paper 3B ratio", *[_ratio(x, y) for x, y in zip(pa, pb, strict=True)]])
    return render(["site", "model", *HEADER], rows, fmt)


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def render(header: list[str], rows: list[list], fmt: str = "markdown", numparse: bool = True) -> str:
    """``rows`` under ``header`` in ``fmt``; ``numparse=False`` keeps number-like strings as written ("2.100")."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; expected one of markdown, csv, latex, plain")
    if fmt == "csv":
        return "\n".join(",".join(_csv(c) for c in row) for row in [header, *rows])
    return tabulate(rows, headers=header, tablefmt=FORMATS[fmt], floatfmt=".4g", missingval="–",
                    disable_numparse=not numparse)


def _csv(cell) -> str:
    if cell is None:
        return ""
    text = f"{cell:.6g}" if isinstance(cell, float) else str(cell)
    return f'"{text}"' if "," in text else text
