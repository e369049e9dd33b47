"""Figure 8 of a pair: its attention logits swept at 16/8/6/4 bits with three scale granularities, and the text."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.files import WeightsParked, parked_weights
from ..io import compressed_name
from ..kinds import ATTN_LOGITS, SEQUENCE
from ..records import read_records
from ..report import render_report
from ..sweep import missing_cells, run_sweep

BITS = (16, 8, 6, 4)
GRANULARITIES = (SEQUENCE, "head", "head_map")  # per sequence; per head (Diff maps share); per head and map


def sweep_pair(pair: dict, path: Path, tasks: dict[str, int | None], batch_size: int = 32, device: str = "cpu",
               bits=BITS, granularities=GRANULARITIES) -> list[dict]:
    """Figure-8 records (resumable JSONL at ``path``): attention logits at ``bits``, every granularity and task."""
    for granularity in granularities:
        for task, limit in tasks.items():
            sweep_or_reuse(list(pair["checkpoints"].values()), path, ATTN_LOGITS, bits=bits, tasks=[task],
                           granularity=granularity, limit=limit, batch_size=batch_size, device=device)
    return read_records(path)


def sweep_or_reuse(checkpoints: list[str], path: Path, target: str, batch_size: int, device: str, **cells) -> None:
    """:func:`~diffquant.sweep.run_sweep` (which skips the cells ``path`` holds) while every checkpoint's weights
    are here; with some parked in history, the records must already hold every cell, or :class:`WeightsParked`."""
    absent = parked_weights(checkpoints)
    if not absent:
        run_sweep(checkpoints, path, target, batch_size=batch_size, device=device, progress=False, **cells)
    elif missing := missing_cells(checkpoints, path, target, **cells):
        ckpt, bits, task = missing[0]
        raise WeightsParked(absent[0], f"{path} lacks {len(missing)} of the pair's cells ({ckpt}, {bits} bits, "
                                       f"{task} first)")


def sweep_path(out: Path, pair: dict) -> Path:
    """Where a pair's Figure-8 records live under an output folder (its profile: ``table5.profile_path``)."""
    return records_path(Path(out) / "figure8", pair["pair"])


def records_path(folder: Path, name: str) -> Path:
    """``folder/NAME.jsonl.gz``: study records are written gzip-compressed (:mod:`diffquant.records`), a fifth of
    their plain size; an older output's plain ``NAME.jsonl`` where only that exists."""
    return compressed_name(Path(folder) / f"{name}.jsonl")


def figure8_text(results: list[dict], sweep_path_of) -> str:
    """Markdown: per verdict, the degradation report of its records (``sweep_path_of(verdict)`` finds them)."""
    parts = []
    for r in results:
        parts += [f"### {r['pair']}", "", render_report(read_records(sweep_path_of(r)), fmt="markdown"), ""]
    return "\n".join(parts)
