"""The verdict files of an output folder, written atomically from verdicts and records."""

from __future__ import annotations

import json
from pathlib import Path

from ..io import atomic_write_text
from ..report import render_report
from .emergence_table import emergence_table
from .figure8 import figure8_text, sweep_path
from .fresh_curves import fresh_curves_table
from .gate import gate_table
from .memorisation import memorisation_table
from .seeds import over_seeds, seeds_table
from .table5 import sites_table, table5_text
from .trend import plot_verdict_trend, trend_table
from .zeroshot import zeroshot_table


def write_outputs(out: Path, results: list[dict], table5: dict[str, dict], note: str = "") -> None:
    """Every verdict file from the records: pairs.json, seeds.json, gate.md (with where the top values sit),
    seeds.md, table5.md, figure8.md (from ``sweep_path``), trend.md, trend.png and memorisation.md; ``note`` heads
    each markdown file."""
    out = Path(out)
    summary = over_seeds(results)
    atomic_write_text(out / "pairs.json", json.dumps(results, indent=1))
    atomic_write_text(out / "seeds.json", json.dumps(summary, indent=1))
    atomic_write_text(out / "gate.md", note + gate_table(results) + "\n\n" + sites_table(results) + "\n")
    atomic_write_text(out / "seeds.md", note + seeds_table(summary) + "\n")
    atomic_write_text(out / "table5.md", note + table5_text(table5) + "\n")
    atomic_write_text(out / "figure8.md", note + figure8_text(results, lambda r: sweep_path(out, r)) + "\n")
    atomic_write_text(out / "trend.md", note + trend_table(results) + "\n")
    plot_verdict_trend(results, out / "trend.png")
    atomic_write_text(out / "memorisation.md", note + memorisation_table(results) + "\n")


def write_zeroshot(out: Path, verdicts: list[dict], records_of, note: str = "") -> None:
    """zeroshot.json and zeroshot.md: the chance tests, then Figure 8 on the tasks above chance (``records_of(v)``
    gives a verdict's records)."""
    out = Path(out)
    atomic_write_text(out / "zeroshot.json", json.dumps(verdicts, indent=1))
    parts = [note + zeroshot_table(verdicts), ""]
    for v in verdicts:
        if v["above_chance"]:
            records = [r for r in records_of(v) if r["task"] in v["above_chance"]]
            parts += [f"### {v['pair']}", "", render_report(records, fmt="markdown"), ""]
    atomic_write_text(out / "zeroshot.md", "\n".join(parts) + "\n")


def write_emergence(out: Path, runs: dict[str, list[dict]], note: str = "") -> None:
    """emergence.json and emergence.md: each long run's tracked top-1 in blocks of training tokens."""
    out = Path(out)
    atomic_write_text(out / "emergence.json", json.dumps(runs, indent=1))
    atomic_write_text(out / "emergence.md", note + emergence_table(runs) + "\n")


def write_fresh_curves(out: Path, runs: dict[str, tuple[dict, dict]], note: str = "") -> None:
    """fresh_curves.md: each streamed run's validation loss beside its corpus run's (``fresh_curves_table``)."""
    atomic_write_text(Path(out) / "fresh_curves.md", note + fresh_curves_table(runs) + "\n")
