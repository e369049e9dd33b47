"""The sequence length a checkpoint was trained at, where known (files may declare a longer context)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..io import read_json_file

# Models whose files declare a longer context than they were trained at, by sha256 of the file.
KNOWN_TRAINING_CONTEXT = {
    # stories260K.gguf declares 2048; llama2.c's recipe (doc/stories260K.md) trained it at 512
    "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d": 512,
}
_KNOWN_SIZES = {1185376}  # file sizes of those models: other files are not hashed


def training_context(path: str | Path) -> int | None:
    """The sequence length a checkpoint was trained at, where known: a known model file (e.g. stories260K,
    declared 2048, trained at 512) or the ``train_log.json`` of the run holding ``run/final`` or
    ``run/snapshots/stepN``; None otherwise."""
    path = Path(path)
    if path.is_file():
        if path.stat().st_size not in _KNOWN_SIZES:
            return None
        return KNOWN_TRAINING_CONTEXT.get(hashlib.sha256(path.read_bytes()).hexdigest())
    run = path.parent if path.name == "final" else path.parent.parent if path.parent.name == "snapshots" else None
    if run is None or not (run / "train_log.json").is_file():
        return None
    try:
        train = read_json_file(run / "train_log.json").get("train_config")
    except (OSError, ValueError):
        return None
    seq_len = train.get("seq_len") if isinstance(train, dict) else None
    return seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0 else None
