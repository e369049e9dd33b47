"""Statistics over seeds (the unit of replication): per-seed ratios and 4-bit advantages, sign tests, t intervals."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binomtest
from scipy.stats import t as student_t

from ..tables import render
from .cells import fmt
from .pair import arm_order


def sign_test(values: list[float]) -> dict:
    """How many values are > 0 and the two-sided exact sign-test p (ties dropped)."""
    signs = [v > 0 for v in values if v != 0]
    p = binomtest(sum(signs), len(signs)).pvalue if signs else None
    return {"n": len(values), "positive": sum(signs), "p": p}


def mean_interval(values: list[float], level: float = 0.95) -> dict:
    """Mean over seeds with a Student-t interval (seeds are the unit of replication; n ≥ 2)."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return {"mean": mean, "low": None, "high": None, "n": len(x)}
    half = float(student_t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(x)}


def over_seeds(results: list[dict]) -> list[dict]:
    """Per (preset, budget, other arm): per-seed ratios and 4-bit advantages, sign tests and pooled means."""
    keys = sorted({(r["preset"], r["budget"], r["tokens"], o) for r in results for o in r["versus"]},
                  key=lambda k: (k[0] != "xs", k[2], k[1], arm_order(k[3])))  # no set order
    out = []
    for preset, budget, tokens, other in keys:
        mine = sorted((r for r in results if (r["preset"], r["budget"]) == (preset, budget) and other in r["versus"]),
                      key=lambda r: r["seed"])
        out.append({"preset": preset, "budget": budget, "tokens": tokens, "other": other,
                    "seeds": [r["seed"] for r in mine], "gated": [r["gate"] for r in mine],
                    **seed_statistics([r["versus"][other] for r in mine])})
    return out


def seed_statistics(vs: list[dict]) -> dict:
    """The seeds' ``versus`` entries of one other arm: ratios with sign tests on their logs and geometric means,
    and per 4-bit scheme the advantages with sign tests and pooled t intervals."""
    out = {}
    for key in ("logit_ratio", "hidden_ratio"):
        values = [v[key] for v in vs]
        out[key] = {"per_seed": values, "sign_test": sign_test([math.log(x) for x in values]),
                    "geomean": float(np.exp(np.mean(np.log(values))))}
    out["advantage_4bit"] = {}
    for scheme in sorted({s for v in vs for s in v["advantage_4bit"]}):
        values = [v["advantage_4bit"][scheme]["advantage"] for v in vs if scheme in v["advantage_4bit"]]
        out["advantage_4bit"][scheme] = {"per_seed": values, "sign_test": sign_test(values),
                                         "pooled": mean_interval(values)}
    return out


def ratio_cell(ratio: dict) -> str:
    """Per-seed ratios, their geometric mean and sign test."""
    test = ratio["sign_test"]
    return (f"{' / '.join(fmt(x) for x in ratio['per_seed'])} (geomean {fmt(ratio['geomean'])}; "
            f"{test['positive']}/{test['n']} > 1, p {fmt(test['p'])})")


def seeds_cell(entry: dict) -> str:
    """The seeds pooled, naming those whose Transformer is below the gate (pooled all the same: say so)."""
    ungated = [str(s) for s, gated in zip(entry["seeds"], entry["gated"], strict=True) if not gated]
    return " / ".join(map(str, entry["seeds"])) + (f" (not gated: {', '.join(ungated)})" if ungated else "")


def seeds_table(summary: list[dict]) -> str:
    """One row per (size, budget, other arm, 4-bit scheme); the ratios on each group's first row."""
    rows = []
    for e in summary:
        ratios = [ratio_cell(e[key]) for key in ("logit_ratio", "hidden_ratio")]
        for i, (scheme, a) in enumerate(e["advantage_4bit"].items()):
            pooled = a["pooled"]
            rows.append([e["preset"], e["budget"], e["other"], seeds_cell(e),
                         *(ratios if i == 0 else ["", ""]), scheme,
                         " / ".join(f"{x:+.3f}" for x in a["per_seed"]),
                         f"{pooled['mean']:+.3f} [{fmt(pooled['low'], 3)}, {fmt(pooled['high'], 3)}]",
                         f"{a['sign_test']['positive']}/{a['sign_test']['n']} (p {fmt(a['sign_test']['p'])})"])
    header = ["size", "budget", "other arm", "seeds", "logit top-1 T/other", "hidden top-1 T/other",
              "4-bit scheme, task", "advantage per seed (Δ ln ppl)", "mean over seeds [95% t]",
              "other lost less (sign test)"]
    return render(header, rows)
