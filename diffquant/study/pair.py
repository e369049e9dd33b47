"""A pair's arms in table order, and the label of a training budget."""

from __future__ import annotations

from ..arches import ArchColumn

ARCH_SHORT = ArchColumn("short")  # arch -> one letter (diffquant/arches.py); its order is the tables' order


def tokens_label(tokens: int | None) -> str:
    """``41943040`` -> ``41.9M``; a dash when not known (a checkpoint without its training log)."""
    if tokens is None:
        return "—"
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if tokens >= size:
            return f"{tokens / size:.3g}{unit}"
    return str(tokens)


def others(pair: dict) -> list[str]:
    """The arms set against the Transformer, in a stable order."""
    return sorted((a for a in pair["checkpoints"] if a != "transformer"), key=arm_order)


def arm_order(arch: str) -> int:
    return list(ARCH_SHORT).index(arch)
