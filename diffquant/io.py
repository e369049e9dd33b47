"""Atomic file writes: a temporary file beside the target, then a rename (never a half-written file)."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path with the target's suffix; on success it replaces ``path``, on error it vanishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def dump_json(data: dict, path: str | os.PathLike | None = None) -> str:
    """Stable JSON text of ``data`` (sorted keys); written atomically to ``path`` when given."""
    text = json.dumps(data, indent=2, sort_keys=True)
    if path is not None:
        atomic_write_text(path, text + "\n")
    return text
