"""Cells of the verdict tables: numbers, flags and one value per arm."""

from __future__ import annotations

from .pair import ARCH_SHORT


def fmt(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def arms_cell(pair: dict, values: dict, digits: int) -> str:
    """``T 312.4 / D 40.1``: one value per arm of ``pair``, in its checkpoints' order."""
    return " / ".join(f"{ARCH_SHORT[a]} {fmt(values[a], digits)}" for a in pair["checkpoints"])
