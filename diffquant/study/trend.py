"""The verdicts against training tokens: each training run's cooled budgets, as a table and as trend.png."""

from __future__ import annotations

from pathlib import Path

from ..kinds import ATTN_LOGITS, HIDDEN, SEQUENCE
from ..plots import plot_trend
from ..tables import PAPER_TABLE5, render
from .cells import fmt, yes_no
from .gate import GATE_TASK, per_sequence
from .pair import tokens_label

TREND_SCHEME = f"attn_logits/{SEQUENCE} {GATE_TASK}"  # the 4-bit advantage drawn in trend.png
# the 4-bit advantages trend.md lists: (column, scheme and task prefix of the verdict's advantage_4bit keys)
TREND_ADVANTAGES = (("per sequence, TinyStories", TREND_SCHEME),
                    ("per sequence, books", f"attn_logits/{SEQUENCE} test"),
                    ("per head, TinyStories", f"attn_logits/head {GATE_TASK}"),
                    ("per head and map, TinyStories", f"attn_logits/head_map {GATE_TASK}"))


def trend_runs(results: list[dict], other: str = "diff") -> dict[str, list[dict]]:
    """The cooled pairs with an ``other`` arm per training run, by training tokens. A pair's ``run`` names the run
    its budgets branch from (default: size and seed), so runs at different learning rates or on different data
    are never joined."""
    runs: dict[str, list[dict]] = {}
    for r in sorted(results, key=lambda r: r["tokens"]):
        if r.get("cooled") and other in r["versus"]:
            runs.setdefault(r.get("run", f"{r['preset']}-s{r['seed']}"), []).append(r)
    return runs


def advantage_of(versus: dict, scheme: str) -> dict | None:
    """The 4-bit advantage whose key starts with ``scheme`` (keys end with the task's window count)."""
    return next((a for key, a in versus["advantage_4bit"].items() if key.startswith(scheme)), None)


def interval_cell(advantage: dict | None) -> str:
    if advantage is None:
        return "—"
    return f"{advantage['advantage']:+.3f} [{advantage['low']:+.3f}, {advantage['high']:+.3f}]"


def trend_table(results: list[dict], other: str = "diff") -> str:
    """trend.png's numbers, one row per cooled budget of each run: whether it passes the gate, the Transformer /
    ``other`` top-1 ratios, both arms' perplexity factor at 4-bit per-sequence logits and ``other``'s 4-bit
    advantages with paired intervals."""
    rows = []
    for run, pairs in trend_runs(results, other).items():
        for r in pairs:
            vs, growth = r["versus"][other], r["ppl_growth_4bit"]
            rows.append([run, tokens_label(r["tokens"]), yes_no(r["gate"]), vs["logit_ratio"],
                         vs["hidden_ratio"],
                         f"{fmt(per_sequence(growth['transformer']))} / {fmt(per_sequence(growth[other]))}",
                         *(interval_cell(advantage_of(vs, scheme)) for _, scheme in TREND_ADVANTAGES)])
    header = ["run", "tokens", "gate", "logit top-1 T/other", "hidden top-1 T/other", "ppl × at 4-bit logits T / other",
              *(f"advantage at 4 bits, {column}" for column, _ in TREND_ADVANTAGES)]
    return render(header, rows)


def plot_verdict_trend(results: list[dict], path: Path, other: str = "diff") -> None:
    """The trend figure of verdict results (:func:`diffquant.plots.plot_trend` draws it from series): Transformer
    / ``other`` ratios and ``other``'s 4-bit advantage against training tokens, cooled pairs only, one line per
    run (:func:`trend_runs`), the pairs below the gate hollow."""
    series = {run: [trend_point(r["versus"][other], r) for r in pairs]
              for run, pairs in trend_runs(results, other).items()}
    if series:
        paper = None if other != "diff" else tuple(
            PAPER_TABLE5[("transformer", kind)][0] / PAPER_TABLE5[("diff", kind)][0] for kind in (ATTN_LOGITS, HIDDEN))
        plot_trend(series, path, paper=paper, scheme=TREND_SCHEME)


def trend_point(versus: dict, result: dict) -> dict:
    return {"tokens": result["tokens"], "logit_ratio": versus["logit_ratio"], "hidden_ratio": versus["hidden_ratio"],
            "advantage": advantage_of(versus, TREND_SCHEME), "gate": result["gate"]}
