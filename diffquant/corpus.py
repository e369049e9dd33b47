"""Token corpora on disk: a folder of token-id shards plus ``manifest.json`` (what drew them, and each shard's sha256).

Written by ``diffquant sample`` (stories drawn from a teacher model, see :mod:`diffquant.sample`) and read by the
trainer (``diffquant train --data DIR``). Each shard is raw little-endian token ids (uint16 where the vocabulary
fits, else int32), stories concatenated, each starting with BOS, so training windows see document boundaries.
Shards are large and regenerated from the manifest's seed; the manifest and the tokenizer file are small and
committed.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import load_documents
from .io import read_json_file
from .tokenizer import SENTENCEPIECE_FILE, TOKENIZER_FILE

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TOKENIZER_NAMES = (SENTENCEPIECE_FILE, TOKENIZER_FILE)  # a corpus ships its teacher's tokenizer
HELDOUT_SOURCE = "tinystories-cased"  # real, cased TinyStories text: the student-teacher gap is measured on it


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.bin"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Corpus:
    """A loaded corpus: all shards' ids in order, the manifest, and the folder."""

    ids: np.ndarray
    manifest: dict
    path: Path

    @property
    def tokenizer_path(self) -> Path | None:
        found = [self.path / n for n in TOKENIZER_NAMES if (self.path / n).is_file()]
        return found[0] if found else None


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a token corpus (no {MANIFEST}); make one with `diffquant sample`")
    manifest = read_json_file(path)
    for key in ("vocab_size", "dtype", "shards", "bos_id"):
        if key not in manifest:
            raise ValueError(f"{path} is not a corpus manifest (no {key!r})")
    return manifest


def missing_shards(folder: str | Path, manifest: dict) -> list[int]:
    """Indices of the manifest's shards that are absent from the folder (to be regenerated from the seed)."""
    return [i for i, s in enumerate(manifest["shards"]) if not (Path(folder) / s["file"]).is_file()]


def load_corpus(folder: str | Path, vocab_size: int | None = None, verify: bool = True) -> Corpus:
    """Every shard's ids concatenated; each shard's sha256 is checked against the manifest when ``verify``.

    ``vocab_size``: the model's; a corpus whose ids do not fit is refused.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if vocab_size is not None and manifest["vocab_size"] > vocab_size:
        raise ValueError(f"corpus {folder} has a vocabulary of {manifest['vocab_size']} tokens; the model has only "
                         f"{vocab_size}")
    gone = missing_shards(folder, manifest)
    if gone:
        raise FileNotFoundError(f"corpus {folder} lacks {len(gone)} of its {len(manifest['shards'])} shards; "
                                f"regenerate them with: {manifest.get('command', 'diffquant sample')}")
    if not manifest["shards"]:
        raise ValueError(f"corpus {folder} holds no shards")
    dtype = np.dtype(manifest["dtype"])
    parts = []
    for shard in manifest["shards"]:
        path = folder / shard["file"]
        if verify and file_sha256(path) != shard["sha256"]:
            raise ValueError(f"{path} does not match its sha256 in the manifest (corrupt or from another run)")
        parts.append(np.fromfile(path, dtype=dtype))
    ids = np.concatenate(parts)
    if ids.size and int(ids.max()) >= manifest["vocab_size"]:
        raise ValueError(f"corpus {folder} holds token ids >= its vocabulary size {manifest['vocab_size']}")
    return Corpus(ids, manifest, folder)


def heldout_ids(tokenizer, source: str = HELDOUT_SOURCE) -> np.ndarray:
    """The real held-out text: each document with one BOS in front. (The cased TinyStories sample marks no story
    boundaries — stories and paragraphs are both separated by a blank line — so it is one document.)"""
    dtype = token_dtype(tokenizer.vocab_size)
    docs = load_documents(source)
    return np.concatenate([np.asarray([tokenizer.bos_id, *ids], dtype=dtype)
                           for ids in tokenizer.encode_batch([d.text for d in docs])])
