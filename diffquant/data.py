"""Reading, normalising, splitting and tokenising the text shipped under ``calib/``.

Pure: imports no model code. Text is read transparently from ``.txt``, ``.xz``, ``.bz2`` or ``.gz`` files,
decoded as UTF-8 (BOM dropped) with a latin-1 fallback for the two NLTK files that use it, line ends are
turned into ``\\n`` and Project Gutenberg headers/footers are dropped.

Splits are by whole document, from fixed lists (see :data:`VALIDATION`, :data:`TEST`, :data:`EXCLUDED`):

* validation: Gutenberg novel *The Adventures of Sherlock Holmes* (#1661);
* test: Gutenberg novels *Dracula* (#345) and *Pride and Prejudice* (#1342);
* train: every other document of ``gutenberg-novels``, ``nltk-gutenberg``, ``tinyshakespeare`` and
  ``tinystories`` (lowercased, one document per story), except NLTK's ``melville-moby_dick`` (the same book
  as novel #2701) and the first :data:`TINYSTORIES_CASED_OVERLAP` stories (the lowercased copies of the
  ``tinystories-cased`` sample, which evaluates stories260K);
* never in a split: ``tinystories-cased`` and the WikiText-2 files (held-out domain).
"""
from __future__ import annotations

import bz2
import gzip
import hashlib
import logging
import lzma
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError, first_line

log = logging.getLogger(__name__)

CALIB_ENV = "DIFFQUANT_CALIB"
SPLITS = ("train", "validation", "test")

VALIDATION = ("gutenberg-novels/The-Adventures-of-Sherlock-Holmes_1661",)
TEST = ("gutenberg-novels/Dracula_345", "gutenberg-novels/Pride-and-Prejudice_1342")
# Same book as gutenberg-novels/Moby-Dick--Or-The-Whale_2701 (kept in train): one copy is enough.
EXCLUDED = ("nltk-gutenberg/melville-moby_dick",)
TRAIN_SOURCES = ("gutenberg-novels", "nltk-gutenberg", "tinyshakespeare", "tinystories")
# The cased sample is the first 293 stories of the lowercased file, cased (checked in tests): keep them
# out of train so an evaluation on tinystories-cased is never on training text.
TINYSTORIES_CASED_OVERLAP = 293

# source name -> (folder or file under calib/, how the text divides into documents)
SOURCES: dict[str, tuple[str, str]] = {
    "gutenberg-novels": ("corpus/gutenberg-novels", "files"),
    "nltk-gutenberg": ("corpus/nltk-gutenberg", "files"),
    "tinyshakespeare": ("corpus/tinyshakespeare/input.txt", "file"),
    "tinystories": ("corpus/tinystories/tinystories_lowercased.txt", "stories"),
    "tinystories-cased": ("corpus/tinystories/tinystories_sample_cased.txt", "file"),
    "wikitext2-test": ("heldout/wikitext-2/test.txt", "file"),
    "wikitext2-valid": ("heldout/wikitext-2/valid.txt", "file"),
    "wikitext2-test-raw": ("heldout/wikitext-2/wiki.test.raw", "file"),
}

_COMPRESSED = {".xz": lzma.open, ".bz2": bz2.open, ".gz": gzip.open}
_TEXT_FILE = re.compile(r"\.(txt|raw)(\.(xz|bz2|gz))?$")

_PG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG[^\n]*$", re.MULTILINE | re.IGNORECASE)
_PG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG[^\n]*$", re.MULTILINE | re.IGNORECASE)
# Old-style (pre-2003) header ends with e.g. "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*".
_PG_SMALL_PRINT_END = re.compile(r"^\*END\*? ?THE SMALL PRINT[^\n]*$", re.MULTILINE | re.IGNORECASE)
_PG_END_LINE = re.compile(r"^End of (the )?Project Gutenberg[^\n]*$", re.MULTILINE | re.IGNORECASE)
_PG_TAIL_CHARS = 2000  # the "End of the Project Gutenberg EBook" line sits just before the END marker


@dataclass(frozen=True)
class Document:
    """One whole text (a book, a play, a story); splits never cut through one."""

    name: str
    text: str


def calib_dir() -> Path:
    """The data folder: ``$DIFFQUANT_CALIB`` if set, else the copy an installed wheel carries
    (``diffquant/_data/calib``, written by setup.py's build hook), else ``calib/`` next to the package (a
    repository checkout)."""
    env = os.environ.get(CALIB_ENV)
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent
    packaged = package / "_data" / "calib"
    return packaged if packaged.is_dir() else package.parent / "calib"


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, decompressed according to its suffix (.xz, .bz2, .gz)."""
    path = Path(path)
    opener = _COMPRESSED.get(path.suffix.lower(), open)
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (lzma.LZMAError, OSError, EOFError) as exc:
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise UserError(f"{path} is corrupt or truncated ({first_line(exc)})") from None


def decode(raw: bytes) -> str:
    """UTF-8 with any BOM dropped; files that are not UTF-8 (two NLTK texts) are latin-1 throughout."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def normalize_newlines(text: str) -> str:
    """``\r\n`` and ``\r`` become ``\n``; DOS end-of-file marks (``\x1a``, in one NLTK file) go."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x1a", "")


def strip_gutenberg(text: str) -> str:
    """Keep only the body between Project Gutenberg's START and END markers (either may be missing)."""
    end = _PG_END.search(text)
    body = text[: end.start()] if end else text
    start = _PG_START.search(body) or _PG_SMALL_PRINT_END.search(body)
    if start:
        body = body[start.end():]
    if not (start or end):
        return text
    tail = list(_PG_END_LINE.finditer(body, max(0, len(body) - _PG_TAIL_CHARS)))
    if tail:
        body = body[: tail[-1].start()]
    return body.strip("\n") + "\n"


def read_text(path: str | os.PathLike) -> str:
    """Read a text file (optionally compressed) and normalise it: decode, ``\\n`` line ends, no PG boilerplate.
    Binary files (NUL bytes, or more than 1% control bytes) are refused rather than read as latin-1."""
    raw = read_bytes(path)
    if looks_binary(raw):
        raise UserError(f"{path} is not a text file (it holds binary bytes)")
    return strip_gutenberg(normalize_newlines(decode(raw)))


_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\r\f\x1a")


def looks_binary(raw: bytes) -> bool:
    """NUL bytes anywhere, or more than 1% control bytes in the first MiB."""
    if b"\x00" in raw:
        return True
    sample = raw[: 1 << 20]
    controls = len(sample) - len(sample.translate(None, delete=_CONTROL_BYTES))
    return controls > len(sample) // 100


def _doc_name(path: Path) -> str:
    return _TEXT_FILE.sub("", path.name)


def _resolve(base: Path, rel: str) -> Path:
    """``rel`` under ``base``, shipped either compressed (.xz/.bz2/.gz) or plain."""
    for suffix in (".xz", "", ".bz2", ".gz"):
        cand = base / (rel + suffix)
        if cand.exists():
            return cand
    raise FileNotFoundError(f"data not found: {base / rel} (set {CALIB_ENV} or run experiments/make_calib.py)")


def split_stories(text: str) -> list[str]:
    """TinyStories file: paragraphs are separated by a blank line, stories by a single newline."""
    return [s.strip("\n") + "\n" for s in re.split(r"(?<=[^\n])\n(?=[^\n])", text) if s.strip()]


def _file_documents(paths: Sequence[Path], prefix: str) -> list[Document]:
    return [Document(f"{prefix}/{_doc_name(p)}", read_text(p)) for p in paths]


def _source_documents(source: str, base: Path) -> list[Document]:
    rel, kind = SOURCES[source]
    if kind == "files":
        folder = base / rel
        if not folder.is_dir():
            raise FileNotFoundError(f"data folder not found: {folder} (set {CALIB_ENV})")
        return _file_documents(sorted(p for p in folder.iterdir() if _TEXT_FILE.search(p.name)), source)
    path = _resolve(base, rel)
    if kind == "stories":
        stories = split_stories(read_text(path))
        return [Document(f"{source}/{i:05d}", s) for i, s in enumerate(stories)]
    return [Document(f"{source}/{_doc_name(path)}", read_text(path))]


def _path_documents(path: Path) -> list[Document]:
    if path.is_dir():
        return _file_documents(sorted(p for p in path.iterdir() if p.is_file()), path.name)
    if not path.is_file():
        raise FileNotFoundError(f"no such corpus: {path} (named sources: {', '.join(SOURCES)})")
    return [Document(_doc_name(path), read_text(path))]


def load_documents(source: str | os.PathLike, calib: str | os.PathLike | None = None) -> list[Document]:
    """Documents of a named source (see :data:`SOURCES`) or of a file / folder path, in a fixed order.

    Raises FileNotFoundError when the data is missing and ValueError when it holds no text.
    """
    base = Path(calib) if calib is not None else calib_dir()
    if isinstance(source, str) and source in SOURCES:
        docs = _source_documents(source, base)
    else:
        docs = _path_documents(Path(source))
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise ValueError(f"corpus {source!s} holds no text")
    return docs


def assign_split(name: str) -> str | None:
    """The split of a document by name, or None for documents in no split."""
    if name in VALIDATION:
        return "validation"
    if name in TEST:
        return "test"
    source, _, rest = name.partition("/")
    if name in EXCLUDED or source not in TRAIN_SOURCES:
        return None
    if source == "tinystories" and rest.isdigit() and int(rest) < TINYSTORIES_CASED_OVERLAP:
        return None
    return "train"


def split_documents(docs: Iterable[Document]) -> dict[str, list[Document]]:
    """Group documents into train / validation / test by :func:`assign_split`, keeping their order."""
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    for doc in docs:
        split = assign_split(doc.name)
        if split is not None:
            out[split].append(doc)
    return out


def load_split(split: str, calib: str | os.PathLike | None = None) -> list[Document]:
    """The documents of ``split`` ("train", "validation" or "test"), always in the same order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    docs = [d for src in TRAIN_SOURCES for d in load_documents(src, calib)]
    chosen = split_documents(docs)[split]
    if not chosen:
        raise ValueError(f"split {split!r} is empty: its documents are missing from the data folder")
    log.info("split %s: %d documents, %d characters", split, len(chosen), sum(len(d.text) for d in chosen))
    return chosen


def documents(spec: str | os.PathLike) -> list[Document]:
    """Documents named by a split ("train" / "validation" / "test"), a calib source, or a file path."""
    return load_split(str(spec)) if str(spec) in SPLITS else load_documents(spec)


def encode_documents(tokenizer, docs: Iterable[Document], bos: bool = True) -> np.ndarray:
    """Token ids of all documents, concatenated, each preceded by the tokenizer's BOS id.

    With the project tokenizer BOS = EOS = ``<|endoftext|>``, so this is one separator between documents
    (and one at the start); with a SentencePiece Llama tokenizer it is BOS per document, as llama2.c trains.
    Windows drawn from the array therefore see document boundaries. uint16 when the vocabulary fits, else int32.
    """
    texts = [d.text for d in docs]
    if not texts:
        raise ValueError("no documents to encode")
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    parts = []
    for ids in tokenizer.encode_batch(texts):
        if bos:
            parts.append(np.array([tokenizer.bos_id], dtype=dtype))
        parts.append(np.asarray(ids, dtype=dtype))
    return np.concatenate(parts)


def data_fingerprint(docs: Iterable[Document]) -> str:
    """sha256 over the documents' texts in order (length-prefixed), for logs and result records."""
    h = hashlib.sha256()
    for doc in docs:
        raw = doc.text.encode("utf-8")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()
