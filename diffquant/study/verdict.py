"""One pair's verdict: the gate, every arm's top-1s, 4-bit growths and top sites, and each other arm against the
Transformer."""

from __future__ import annotations

from ..kinds import ATTN_LOGITS, HIDDEN, SEQUENCE
from ..report import comparison_rows
from .figure8 import GRANULARITIES
from .gate import passes_gate, ppl_growth
from .memorisation import memorisation_of
from .pair import others
from .table5 import top1, top_sites


def verdict(pair: dict, table5: dict[str, dict], records: list[dict]) -> dict:
    """The verdict of ``pair`` from its Table-5 records (arch -> record) and its Figure-8 sweep records."""
    arms = list(pair["checkpoints"])
    growth = {arch: {g: ppl_growth(records, arch, g) for g in GRANULARITIES} for arch in arms}
    gate = passes_gate(top1(table5["transformer"], ATTN_LOGITS), growth["transformer"][SEQUENCE])
    return {**pair, "gate": gate,
            "logit_top1": {arch: top1(table5[arch], ATTN_LOGITS) for arch in arms},
            "hidden_top1": {arch: top1(table5[arch], HIDDEN) for arch in arms},
            "lambda": {arch: table5[arch]["lambda"] for arch in arms if table5[arch].get("lambda")},
            "top_sites": {arch: {kind: top_sites(table5[arch]["sites"][kind]) for kind in (ATTN_LOGITS, HIDDEN)}
                          for arch in arms},
            "ppl_growth_4bit": growth, "versus": versus_transformer(pair, table5, records),
            "memorisation": memorisation_of(pair)}


def versus_transformer(pair: dict, table5: dict[str, dict], records: list[dict]) -> dict[str, dict]:
    """Each other arm: Table-5 ratios (Transformer / other) and 4-bit degradation advantages with paired
    bootstrap intervals."""
    rows = [c for c in comparison_rows(records) if c.bits == 4]
    transformer = table5["transformer"]
    return {other: {
        "logit_ratio": top1(transformer, ATTN_LOGITS) / top1(table5[other], ATTN_LOGITS),
        "hidden_ratio": top1(transformer, HIDDEN) / top1(table5[other], HIDDEN),
        "advantage_4bit": {f"{c.scheme} {c.task}": {"advantage": c.advantage, "low": c.low, "high": c.high}
                           for c in rows if c.candidate_arch == other},
    } for other in others(pair)}
