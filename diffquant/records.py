"""Sweep records, the one module that knows their format: schema, keys, validation, reading, appending, the
checkpoint sha256 and label (pure: no torch, no model). The sweep writes with it, the report reads with it.

A records file holds JSON objects, one per line (see docs/ARCHITECTURE.md, section 6.3); a name ending in ``.gz``
holds the same lines gzip-compressed (a finished file compressed with ``gzip -n``, or one gzip member per appended
record: :func:`~diffquant.io.locked_append`), read and appended to alike. Names that changed are
read in their old spelling too and normalised on input (:func:`canonical_record`): granularity ``"tensor"`` is
``"sequence"`` (:func:`diffquant.kinds.upgrade_legacy_granularities`), target ``"probs"`` is ``"attn_probs"``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import logging
import math
import os
import platform
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .io import gzip_text, gzipped
from .kinds import ATTN_PROBS, upgrade_legacy_granularities
from .record_arrays import compact_units

log = logging.getLogger(__name__)

SCHEMA = 1
BASELINE_BITS = 16
# What makes two records the same measurement (resuming skips a cell whose key is already in the file).
KEY_FIELDS = ("checkpoint", "target", "bits", "granularity", "group_size", "calib_tokens", "task", "limit", "subset",
              "seed", "attn_impl")
# A quantized record's baseline: the same checkpoint, data and evaluation settings at 16 bits.
BASELINE_FIELDS = ("checkpoint", "task", "limit", "subset", "seed", "attn_impl")
METRICS = {"perplexity": ("perplexity",), "multiple_choice": ("acc", "acc_norm"), "lambada": ("acc", "perplexity")}
TARGET_ALIASES = {"probs": ATTN_PROBS}  # old sweep target names, still read (command line, records)
RUN_SUBFOLDERS = ("snapshots", "branches")  # a training run's run/<this>/stepN checkpoints


def checkpoint_label(path: str | Path) -> str:
    """The one name of a checkpoint in tables, plots and records: ``run/final`` -> ``run``;
    ``run/snapshots/stepN`` -> ``run@stepN``; another ``stepN`` folder -> ``parent/stepN``; else the file's stem
    (``stories260K.gguf`` -> ``stories260K``) or the folder's name."""
    p = Path(path)
    if p.name == "final":
        return p.parent.name
    if p.name.startswith("step") and p.parent.name in RUN_SUBFOLDERS:
        return f"{p.parent.parent.name}@{p.name}"
    if p.name.startswith("step"):
        return f"{p.parent.name}/{p.name}"
    return p.stem if p.is_file() else p.name


def canonical_target(target: str | None) -> str | None:
    """A sweep target's name, old spellings (``probs``) mapped to today's (``attn_probs``)."""
    return TARGET_ALIASES.get(target, target)


def canonical_record(rec: dict) -> dict:
    """``rec`` with today's names for its target and granularities (records written before the renames)."""
    rec = upgrade_legacy_granularities(rec)
    if rec.get("target") is not None:
        rec["target"] = canonical_target(rec["target"])
    return rec


def record_key(rec: dict) -> tuple:
    return tuple(_hashable(record_field(rec, f)) for f in KEY_FIELDS)


def baseline_key(rec: dict) -> tuple:
    return tuple(_hashable(record_field(rec, f)) for f in BASELINE_FIELDS)


def record_field(rec: dict, name: str):
    if name == "subset" and "subset" not in rec:  # records before `subset` existed: --limit was a seeded subset
        return "random" if rec.get("limit") is not None else None
    return rec.get(name)


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


READ_PROGRESS_BYTES = 64 << 20  # reading a records file larger than this shows a progress bar
GZIP_READ_BYTES = 1 << 16  # each member's leftover is copied: small reads keep that cheap


def read_records(path: str | os.PathLike, missing_ok: bool = False, compact: bool = False) -> list[dict]:
    """The records of one JSONL file, in order, read line by line. A last line cut short (no newline, not JSON)
    is skipped with a warning: an interrupted writer leaves exactly that. Any other bad line is a one-line
    ValueError. ``compact``: per-unit lists as arrays (:func:`~diffquant.record_arrays.compact_units`), for large
    files read only to be reported."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return []
        raise FileNotFoundError(f"records file not found: {path}")
    from .progress import progress_bar  # lazy: only reading needs it

    records = []
    size = path.stat().st_size
    with path.open("rb") as fh, _without_cycle_collection(), progress_bar(
            total=size, desc=f"reading {path.name}", unit="B", unit_scale=True, leave=False,
            disable=size < READ_PROGRESS_BYTES) as bar:
        for lineno, raw in enumerate(_record_lines(path, fh), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path} is not a JSONL records file (not UTF-8 text)") from None
            rec = _parse_line(path, lineno, line)
            if rec is not None:
                records.append(compact_units(rec) if compact else rec)
            bar.update(fh.tell() - bar.n)
    return records


def _record_lines(path: Path, fh):
    """The raw lines of an open records file: as they are, or decompressed from its complete gzip members."""
    if not gzipped(path):
        yield from fh
        return
    tail = b""  # a line may run on into the next member
    for text, _ in _gzip_members(path, fh):
        lines, tail = io.BytesIO(tail + text if tail else text), b""  # split at b"\n" only, as the plain file is
        for line in lines:
            if line.endswith(b"\n"):
                yield line
            else:
                tail = line
    if tail:
        yield tail


def _gzip_members(path: Path, fh):
    """(uncompressed bytes, file offset after it) of each complete gzip member of ``fh`` (CRC and length checked
    by zlib), in order; zero bytes between or after members are padding, as gzip reads them. A cut-off last member,
    what an interrupted append leaves, is not yielded (:func:`_cut_member`); bytes that are not gzip are a one-line
    ValueError."""
    end, pending = 0, b""
    while True:
        chunk = pending or fh.read(GZIP_READ_BYTES)
        if not chunk:
            return
        pending = chunk.lstrip(b"\0")
        end += len(chunk) - len(pending)
        if not pending:
            continue
        member, parts, used = zlib.decompressobj(wbits=31), [], 0  # wbits 31: a gzip header and trailer
        while not member.eof:
            pending = pending or fh.read(GZIP_READ_BYTES)
            if not pending:
                _cut_member(path, b"".join(parts))
                return
            try:
                parts.append(member.decompress(pending))
            except zlib.error as exc:
                raise ValueError(f"{path} is not a gzip-compressed records file ({exc})") from None
            used += len(pending) - len(member.unused_data)
            pending = member.unused_data
        end += used
        text, parts = b"".join(parts), None
        yield text, end


def _cut_member(path: Path, partial: bytes) -> None:
    """A cut-off last member is one record an interrupted append left, skipped; one whose readable part already
    holds a whole line held several (a whole file compressed at once, then cut short): refused, never dropped."""
    if b"\n" in partial[:-1]:
        raise ValueError(f"{path}: its last gzip member is cut off and holds several records; recover them with "
                         "`zcat` into a plain .jsonl file and use that")
    log.warning("%s: skipping a truncated last record (interrupted sweep?)", path)


@contextlib.contextmanager
def _without_cycle_collection():
    """Parsed JSON holds no reference cycles, yet millions of new objects trigger the cycle collector again and
    again over everything read so far (~40% of the time of reading a 140 MB file): off while reading."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse_line(path: Path, lineno: int, line: str) -> dict | None:
    """The record on one line (None for a blank line or a cut-off last one: only the last line lacks a newline)."""
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        if not line.endswith("\n") and line.startswith("{"):  # the unterminated last line of a record
            log.warning("%s:%d: skipping a truncated last line (interrupted sweep?)", path, lineno)
            return None
        raise ValueError(f"{path}:{lineno}: not a JSON record (not a records file?)") from None
    problem = record_problem(rec)
    if problem:
        raise ValueError(f"{path}:{lineno}: not a sweep record ({problem})")
    return canonical_record(rec)


def record_problem(rec) -> str | None:
    """What makes ``rec`` unusable as a sweep record (None when it is fine): the fields the tables read."""
    if not isinstance(rec, dict) or not {"checkpoint", "bits", "task", "kind", "metrics"} <= rec.keys():
        return "needs checkpoint, bits, task, kind, metrics"
    if rec["kind"] not in METRICS or not isinstance(rec["metrics"], dict):
        return f"kind must be one of {', '.join(METRICS)} and metrics an object"
    if not isinstance(rec["bits"], int) or isinstance(rec["bits"], bool) or not isinstance(rec["checkpoint"], str):
        return "bits must be an integer and checkpoint a string"
    m = rec["metrics"]
    units = "window_losses" if rec["kind"] == "perplexity" else "items"
    if not isinstance(m.get(units), list) or not all(k in m for k in METRICS[rec["kind"]]):
        return f"metrics need {', '.join(METRICS[rec['kind']])} and {units}"
    if any(v is not None and not _number(v) for v in (m[k] for k in METRICS[rec["kind"]])):
        return "metric values must be numbers or null"
    return _range_problem(rec["bits"], m, units)


# bit widths a record may hold: the quantizers' 2..8 (1 for binary formats), 16 for the baseline, up to 32
BITS_RANGE = (1, 32)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _range_problem(bits: int, m: dict, units: str) -> str | None:
    """Values no evaluation can produce: bits outside :data:`BITS_RANGE`, perplexity <= 0, accuracy outside
    [0, 1], windows of no tokens (their perplexity would be NaN)."""
    if not BITS_RANGE[0] <= bits <= BITS_RANGE[1]:
        return f"bits must lie in {BITS_RANGE[0]}..{BITS_RANGE[1]}, got {bits}"
    ppl = m.get("perplexity")
    if ppl is not None and not (_number(ppl) and ppl > 0):
        return f"perplexity must be positive, got {ppl}"
    for key in ("acc", "acc_norm"):
        if m.get(key) is not None and not (_number(m[key]) and 0 <= m[key] <= 1):
            return f"{key} must lie in [0, 1], got {m[key]}"
    if units == "window_losses" and not _windows_ok(m[units]):
        bad = next(w for w in m[units] if not _windows_ok([w]))
        return f"each window loss must be [nats, tokens] with tokens a positive integer, got {bad}"
    return None


def _windows_ok(windows: list) -> bool:
    """Every window is ``[nats or null, tokens >= 1]`` (checked as one array: records hold millions of them)."""
    try:
        tokens = np.array([w[1] for w in windows])
        nats = np.array([w[0] for w in windows if w[0] is not None], dtype=np.float64)
    except (TypeError, IndexError, KeyError, ValueError):
        return False
    shapes_ok = all(type(w) is list and len(w) == 2 for w in windows)
    return shapes_ok and nats.ndim == 1 and (tokens.size == 0 or (tokens.dtype.kind == "i" and tokens.min() >= 1))


def is_finite(rec: dict) -> bool:
    """No NaN/Inf went into the record's metrics (older records may hold NaN; newer ones null + ``nonfinite``)."""
    values = [rec["metrics"][k] for k in METRICS[rec["kind"]]]
    return not rec.get("nonfinite") and all(v is not None and math.isfinite(v) for v in values)


def load_records(paths: Sequence[str | os.PathLike], compact: bool = False) -> list[dict]:
    """Records of all files, duplicates (same :func:`record_key`) resolved in favour of the last one
    (``compact``: as :func:`read_records`)."""
    latest: dict[tuple, dict] = {}
    for path in paths:
        for rec in read_records(path, compact=compact):
            key = record_key(rec)
            if key in latest:
                log.warning("%s: a second record for %s; keeping the later one", path, key)
            latest[key] = rec
    if not latest:
        raise ValueError(f"no records in {', '.join(str(p) for p in paths)}")
    return list(latest.values())


# ---------------------------------------------------------------------------------------------------- writing

def checkpoint_sha256(path: str | os.PathLike) -> str:
    """sha256 of a checkpoint's files (a folder's regular files with their names, or one file)."""
    path = Path(path)
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def versions() -> dict:
    from . import __version__  # lazy: the package root imports everything

    return {"diffquant": __version__, "torch": _version("torch"), "numpy": _version("numpy"),
            "python": platform.python_version()}


def repair_tail(path: Path) -> None:
    """Drop a cut-off last line (an interrupted write) so appended records start on a fresh line. Call it only
    on a file :func:`read_records` accepted: a tail that does not start a JSON object is refused, never cut."""
    if not path.is_file():
        return
    if gzipped(path):
        _repair_gzip_tail(path)
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    if not data[cut:].startswith(b"{"):
        raise ValueError(f"{path}: its last line is not a record (not a records file?); choose another file")
    try:
        json.loads(data[cut:])
    except ValueError:
        log.warning("%s: removing a truncated last line", path)
        os.truncate(path, cut)
        return
    with path.open("ab") as fh:
        fh.write(b"\n")


def _repair_gzip_tail(path: Path) -> None:
    """:func:`repair_tail` of a gzip records file: cut a cut-off last member; a whole record without its newline
    gets one. A member whose text ends inside a line (never written by :func:`append_record`) is refused: cutting
    it would rewrite the records around it."""
    end, last = 0, b"\n"
    with path.open("rb") as fh:
        for text, member_end in _gzip_members(path, fh):
            end, last = member_end, text or last
        fh.seek(end)
        cut_off = fh.read().strip(b"\0")  # what follows the last whole member, but padding
    line = last[last.rfind(b"\n") + 1:]
    if line and not _is_json(line):
        raise ValueError(f"{path}: its text ends inside a line; decompress it (gunzip) and resume on the plain file")
    if cut_off:
        log.warning("%s: removing a truncated last record", path)
        os.truncate(path, end)
    if line:
        with path.open("ab") as fh:
            fh.write(gzip_text("\n"))


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def append_record(fh, record: dict) -> None:
    """One record as one line, flushed and synced."""
    # one call per line: a crash leaves whole lines or one cut-off tail; records are standard JSON (no NaN)
    fh.write(json.dumps(record, allow_nan=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def _version(package: str) -> str:
    from importlib.metadata import version  # the installed version, without importing torch here

    return version(package)
