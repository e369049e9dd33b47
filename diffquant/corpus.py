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
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import load_documents
from .errors import UserError
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


class CorpusError(UserError, ValueError):
    """A corpus folder or manifest that cannot be used as it is (one-line message)."""


def read_manifest(folder: str | Path) -> dict:
    """The folder's manifest, validated (:func:`check_manifest`) before any shard is touched."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a token corpus (no {MANIFEST}); make one with `diffquant sample`")
    try:
        manifest = read_json_file(path)
    except ValueError as exc:
        raise CorpusError(str(exc)) from None
    check_manifest(manifest, path)
    return manifest


MAX_VOCAB = 1 << 31
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def check_manifest(manifest: dict, where: str | Path) -> None:
    """The one validation of a corpus manifest: field types, the dtype the sampler uses for the vocabulary, and
    each shard named exactly as the sampler names it (``shard_NNNNN.bin``, in order: never a path, never twice)
    with a positive token count and a sha256."""
    for key in ("vocab_size", "dtype", "shards", "bos_id"):
        if key not in manifest:
            raise CorpusError(f"{where} is not a corpus manifest (no {key!r})")
    vocab = manifest["vocab_size"]
    if not _int(vocab) or not 1 <= vocab <= MAX_VOCAB:
        raise CorpusError(f"{where}: vocab_size must be an integer in 1..{MAX_VOCAB}, got {vocab!r}")
    if manifest["dtype"] != token_dtype(vocab).name:
        raise CorpusError(f"{where}: dtype must be {token_dtype(vocab).name!r} for a vocabulary of {vocab} "
                          f"(as `diffquant sample` writes it), got {manifest['dtype']!r}")
    if not _int(manifest["bos_id"]) or not 0 <= manifest["bos_id"] < vocab:
        raise CorpusError(f"{where}: bos_id must be an integer in 0..{vocab - 1}, got {manifest['bos_id']!r}")
    shards = manifest["shards"]
    if not isinstance(shards, list):
        raise CorpusError(f"{where}: shards must be a list, got {type(shards).__name__}")
    for i, shard in enumerate(shards):
        problem = _shard_problem(i, shard)
        if problem:
            raise CorpusError(f"{where}: shard {i}: {problem}")


def _shard_problem(index: int, shard) -> str | None:
    if not isinstance(shard, dict):
        return f"must be an object, got {type(shard).__name__}"
    if shard.get("file") != shard_name(index):
        return (f"file must be {shard_name(index)!r} (shards are named by their index inside the corpus folder), "
                f"got {shard.get('file')!r}")
    if not _int(shard.get("tokens")) or shard["tokens"] <= 0:
        return f"tokens must be a positive integer, got {shard.get('tokens')!r}"
    if not isinstance(shard.get("sha256"), str) or not _SHA256.match(shard["sha256"]):
        return "sha256 must be 64 lowercase hex digits"
    return None


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        how = (f"restore them with: {manifest['restore']}" if manifest.get("restore")  # kept in history, not redrawn
               else f"regenerate them with: {manifest.get('command') or 'diffquant sample'}")
        raise FileNotFoundError(f"corpus {folder} lacks {len(gone)} of its {len(manifest['shards'])} shards; {how}")
    if not manifest["shards"]:
        raise ValueError(f"corpus {folder} holds no shards")
    dtype = np.dtype(manifest["dtype"])
    parts = []
    for shard in manifest["shards"]:
        path = folder / shard["file"]
        size = path.stat().st_size
        if size != shard["tokens"] * dtype.itemsize:
            raise CorpusError(f"{path} holds {size} bytes; the manifest says {shard['tokens']} {dtype.name} tokens "
                              f"({shard['tokens'] * dtype.itemsize} bytes)")
        if verify and file_sha256(path) != shard["sha256"]:
            raise CorpusError(f"{path} does not match its sha256 in the manifest (corrupt or from another run)")
        parts.append(np.fromfile(path, dtype=dtype))
    ids = np.concatenate(parts)
    if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < manifest["vocab_size"]:
        raise CorpusError(f"corpus {folder} holds token ids outside 0..{manifest['vocab_size'] - 1} "
                          f"(its vocabulary)")
    return Corpus(ids, manifest, folder)


def heldout_ids(tokenizer, source: str = HELDOUT_SOURCE) -> np.ndarray:
    """The real held-out text: each document with one BOS in front. (The cased TinyStories sample marks no story
    boundaries — stories and paragraphs are both separated by a blank line — so it is one document.)"""
    dtype = token_dtype(tokenizer.vocab_size)
    docs = load_documents(source)
    return np.concatenate([np.asarray([tokenizer.bos_id, *ids], dtype=dtype)
                           for ids in tokenizer.encode_batch([d.text for d in docs])])
