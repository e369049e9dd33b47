"""The gate: the Transformer is in the outlier regime when its attention-logit top-1 is ≥ 100 and 4-bit
per-sequence logits at least double its perplexity on the real TinyStories held-out text. No Table-5 or
Figure-8 verdict counts without it."""

from __future__ import annotations

from ..kinds import SEQUENCE
from ..tables import render
from .cells import arms_cell, yes_no
from .memorisation import memorisation_cell
from .pair import ARCH_SHORT, tokens_label

GATE_LOGIT_TOP1, GATE_PPL_FACTOR = 100.0, 2.0
GATE_TASK = "tinystories"


def passes_gate(logit_top1: float, ppl_factor: float | None) -> bool:
    """The Transformer's attention-logit top-1 and its perplexity factor at 4-bit per-sequence logits."""
    return logit_top1 >= GATE_LOGIT_TOP1 and (ppl_factor or 0) >= GATE_PPL_FACTOR


def perplexity(records: list[dict], arch: str, bits: int, granularity: str | None, task: str) -> float | None:
    for rec in records:
        if (rec["arch"], rec["bits"], rec.get("granularity"), rec["task"]) == (arch, bits, granularity, task):
            return rec["metrics"]["perplexity"]
    return None


def ppl_growth(records: list[dict], arch: str, granularity: str = SEQUENCE, bits: int = 4,
               task: str = GATE_TASK) -> float | None:
    """Perplexity with ``bits``-bit logits over the unquantized one."""
    base = perplexity(records, arch, 16, None, task)
    quant = perplexity(records, arch, bits, granularity, task)
    return quant / base if base and quant else None


def per_sequence(growth: dict) -> float | None:
    """The per-sequence entry of a growth dict (None where it was not measured)."""
    return growth.get(SEQUENCE)


def lambda_ranges(lambdas: dict[str, list[float]]) -> str:
    """Each Diff arm's smallest and largest λ over layers, and the layers where λ < 0 (the second map is added)."""
    notes = []
    for arch, values in lambdas.items():
        negative = [f"L{i}" for i, v in enumerate(values) if v < 0]
        notes.append(f"{ARCH_SHORT.get(arch, arch)} {min(values):.2f} … {max(values):.2f}"
                     + (f" (< 0: {', '.join(negative)})" if negative else ""))
    return "; ".join(notes) or "-"


def gate_table(results: list[dict]) -> str:
    """One row per verdict: every arm's logit top-1 and 4-bit factor, the gate, Diff's λ and memorisation."""
    rows = [[r["pair"], tokens_label(r["tokens"]), arms_cell(r, r["logit_top1"], 1),
             arms_cell(r, {a: per_sequence(g) for a, g in r["ppl_growth_4bit"].items()}, 2),
             yes_no(r["gate"]), lambda_ranges(r.get("lambda", {})), memorisation_cell(r.get("memorisation", {}))]
            for r in results]
    header = ["pair", "tokens", "logit top-1", "ppl × at 4-bit logits, per sequence",
              f"gate (T top-1 ≥ {GATE_LOGIT_TOP1:g}, T ppl × ≥ {GATE_PPL_FACTOR:g})", "Diff λ over layers",
              "memorisation: fresh − training loss (nats/token)"]
    return render(header, rows)
