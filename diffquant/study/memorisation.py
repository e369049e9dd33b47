"""Each arm's memorisation check, read from its train log (``diffquant.stream`` writes it) or, for a run trained on a
fixed corpus without a teacher, from the record measured afterwards beside the log
(``experiments/memorisation.py``); its gate-table cell, and memorisation.md's summary over arms."""

from __future__ import annotations

from pathlib import Path

from ..io import read_json_file
from ..tables import render
from .cells import fmt
from .pair import ARCH_SHORT

MEASURED_FILE = "memorisation.json"  # beside a run's train_log.json: its check, measured after training


def memorisation_of(pair: dict) -> dict[str, dict]:
    """Each arm's memorisation check from its train log: whether its data was streamed, how many times it cycled a
    fixed corpus, and the fresh − training loss gap with its standard error where the log, or the record measured
    beside it, has one."""
    out = {}
    for arch, path in pair.get("train_logs", {}).items():
        log_file = Path(path)
        if log_file.is_file():
            record = read_json_file(log_file)
            measured = log_file.with_name(MEASURED_FILE)
            check = record.get("memorisation") or (read_json_file(measured) if measured.is_file() else {})
            data = record.get("data", {})
            passes = ({"passes": record["tokens_seen"] / data["corpus_tokens"]}
                      if data.get("corpus_tokens") and "tokens_seen" in record else {})
            out[arch] = {"streamed": bool(data.get("streamed")), **passes, **check}
    return out


def memorisation_cell(memo: dict[str, dict]) -> str:
    """"streamed: none by construction" (with the measured gaps) when every arm was streamed; the arms' gaps
    ± standard error otherwise; "not measured" without checks."""
    gaps = " / ".join(f"{ARCH_SHORT[a]} {m['gap']:.3f} ± {fmt(m.get('se'), 3)}" for a, m in memo.items()
                      if "gap" in m)
    if memo and all(m["streamed"] for m in memo.values()):
        return "streamed: none by construction" + (f" ({gaps})" if gaps else "")
    return gaps or "not measured"


def memorisation_table(results: list[dict]) -> str:
    """memorisation.md: the fresh − training gaps by size, budget and data, each arm once (a Transformer set against
    several arms is one arm), with the passes over the corpus and the largest gap between the arms of one pair."""
    groups: dict[tuple, dict] = {}
    for r in results:
        memo = r.get("memorisation", {})
        data = "streamed" if memo and all(m["streamed"] for m in memo.values()) else "corpus"
        key = (r["preset"], r["tokens"], r["budget"].split(",")[0], data)
        group = groups.setdefault(key, {"arms": {}, "within": []})
        group["arms"].update({r["train_logs"][arch]: m for arch, m in memo.items()})
        gaps = {arch: m["gap"] for arch, m in memo.items() if "gap" in m}
        if "transformer" in gaps:
            group["within"] += [abs(gap - gaps["transformer"]) for arch, gap in gaps.items() if arch != "transformer"]
    rows = [[preset, budget, data, *summary_cells(group)]
            for (preset, _, budget, data), group in sorted(groups.items())]
    header = ["size", "budget", "data", "passes over the corpus", "arms measured",
              "fresh − training (nats/token): mean, range", "largest difference within a pair"]
    return render(header, rows)


def summary_cells(group: dict) -> list:
    """A row's passes, arms measured, gap mean and range, and largest gap difference within a pair."""
    measured = [m for m in group["arms"].values() if "gap" in m]
    gaps = [m["gap"] for m in measured]
    passes = " / ".join(sorted({f"{m['passes']:.2f}" for m in measured if "passes" in m})) or "—"
    mean = f"{sum(gaps) / len(gaps):+.3f}, {min(gaps):+.3f} … {max(gaps):+.3f}" if gaps else "—"
    within = round(max(group["within"]), 3) if group["within"] else None
    return [passes, f"{len(gaps)} of {len(group['arms'])}", mean, within]
