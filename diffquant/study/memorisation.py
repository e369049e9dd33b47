"""Each arm's memorisation check, read from its train log (``diffquant.stream`` writes it), and its table cell."""

from __future__ import annotations

from pathlib import Path

from ..io import read_json_file
from .cells import fmt
from .pair import ARCH_SHORT


def memorisation_of(pair: dict) -> dict[str, dict]:
    """Each arm's memorisation check from its train log: whether its data was streamed, and the fresh − training
    loss gap with its standard error where the log has one."""
    out = {}
    for arch, path in pair.get("train_logs", {}).items():
        if Path(path).is_file():
            record = read_json_file(path)
            out[arch] = {"streamed": bool(record.get("data", {}).get("streamed")),
                         **(record.get("memorisation") or {})}
    return out


def memorisation_cell(memo: dict[str, dict]) -> str:
    """"streamed: none by construction" (with the measured gaps) when every arm was streamed; the arms' gaps
    ± standard error otherwise; "not measured" without checks."""
    gaps = " / ".join(f"{ARCH_SHORT[a]} {m['gap']:.3f} ± {fmt(m.get('se'), 3)}" for a, m in memo.items()
                      if "gap" in m)
    if memo and all(m["streamed"] for m in memo.values()):
        return "streamed: none by construction" + (f" ({gaps})" if gaps else "")
    return gaps or "not measured"
