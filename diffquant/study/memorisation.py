"""Each arm's memorisation check, read from its train log (``diffquant.stream`` writes it) or, for a run trained on a
fixed corpus without a teacher, from the record measured afterwards beside the log
(``experiments/memorisation.py``), and its table cell."""

from __future__ import annotations

from pathlib import Path

from ..io import read_json_file
from .cells import fmt
from .pair import ARCH_SHORT

MEASURED_FILE = "memorisation.json"  # beside a run's train_log.json: its check, measured after training


def memorisation_of(pair: dict) -> dict[str, dict]:
    """Each arm's memorisation check from its train log: whether its data was streamed, and the fresh − training
    loss gap with its standard error where the log, or the record measured beside it, has one."""
    out = {}
    for arch, path in pair.get("train_logs", {}).items():
        log_file = Path(path)
        if log_file.is_file():
            record = read_json_file(log_file)
            measured = log_file.with_name(MEASURED_FILE)
            check = record.get("memorisation") or (read_json_file(measured) if measured.is_file() else {})
            out[arch] = {"streamed": bool(record.get("data", {}).get("streamed")), **check}
    return out


def memorisation_cell(memo: dict[str, dict]) -> str:
    """"streamed: none by construction" (with the measured gaps) when every arm was streamed; the arms' gaps
    ± standard error otherwise; "not measured" without checks."""
    gaps = " / ".join(f"{ARCH_SHORT[a]} {m['gap']:.3f} ± {fmt(m.get('se'), 3)}" for a, m in memo.items()
                      if "gap" in m)
    if memo and all(m["streamed"] for m in memo.values()):
        return "streamed: none by construction" + (f" ({gaps})" if gaps else "")
    return gaps or "not measured"
