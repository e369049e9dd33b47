"""Every file or folder diffquant writes goes through here: atomic, crash-safe, never over an input.

* :func:`atomic_path` / :func:`atomic_write_text`: a temporary file beside the target, then one rename; a name
  ending in ``.gz`` is written gzip-compressed (:func:`gzipped`, :func:`compressed_name`).
* :class:`atomic_dir`: a temporary folder beside the target; an existing target is swapped with it in one
  ``renameat2(RENAME_EXCHANGE)`` call, so the old version stays visible until the new one is complete. Where
  the kernel or file system cannot exchange, two renames are used and a kill between them is repaired by the
  next writer (the old folder is renamed back).
* Temporary names carry the writer's host and pid (``.NAME.diffquant-tmp-HOST-PID-XXXXXXXX``); a writer removes
  the stale ones of dead writers on the same host, for the same target, before it starts.
* :func:`refuse_overlap`: the rule that no output equals, lies inside or contains an input.
* :func:`check_output`: the rule that a writer replaces only a regular file or a folder (never a FIFO, device
  node or socket); every writer here applies it before it touches anything, and the CLI before any work.
* :func:`canonical_safetensors`: safetensors bytes with a sorted header, so equal tensors give equal files.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import socket
import stat
import struct
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

log = logging.getLogger(__name__)

TMP_TAG, OLD_TAG = "diffquant-tmp", "diffquant-old"
# Scratch names keep at most this much of the target's name (a legal 255-byte name plus our tags would not fit);
# longer names are cut and made unique again by a hash of the whole name.
_NAME_KEEP, _SUFFIX_KEEP = 96, 16
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


# ---------------------------------------------------------------------------------------------------- names

def scratch_name(target: Path, tag: str, suffix: str = "", pid: int | None = None) -> Path:
    """``.NAME.TAG-HOST-PID-XXXXXXXX[SUFFIX]`` beside ``target`` (the suffix keeps writers that look at it happy)."""
    pid = os.getpid() if pid is None else pid
    suffix = suffix if len(suffix) <= _SUFFIX_KEEP else ""
    return target.with_name(f".{_short(target.name)}.{tag}-{_host()}-{pid}-{secrets.token_hex(4)}{suffix}")


def _short(name: str) -> str:
    if len(name.encode()) <= _NAME_KEEP:
        return name
    head = name.encode()[:_NAME_KEEP // 2].decode(errors="ignore")
    return head + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


@functools.cache
def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def _scratch_pattern(target: Path) -> re.Pattern:
    """Our scratch names for ``target`` on this host, and ``.NAME.old-PID``: what diffquant before 0.2 left when
    killed between its two renames (the only copy of the old version)."""
    name, tags = re.escape(_short(target.name)), f"{TMP_TAG}|{OLD_TAG}"
    ours = rf"\.{name}\.(?P<tag>{tags})-{re.escape(_host())}-(?P<pid>\d+)-[0-9a-f]{{8}}(\.[^/]*)?"
    legacy = rf"\.{name}\.(?P<legacy>old)-(?P<legacy_pid>\d+)"
    return re.compile(rf"^(?:{ours}|{legacy})$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(target: str | os.PathLike) -> None:
    """Remove the temporary files and folders that dead writers of ``target`` left beside it; a replaced
    version whose writer died before the new one took its place is renamed back first."""
    target = Path(target)
    if not target.parent.is_dir():
        return
    pattern = _scratch_pattern(target)
    for entry in sorted(target.parent.iterdir()):
        match = pattern.match(entry.name)
        if match is None or _alive(int(match["pid"] or match["legacy_pid"])):
            continue
        if (match["tag"] == OLD_TAG or match["legacy"]) and not target.exists():
            log.warning("restoring %s from %s (a replacement was interrupted)", target, entry.name)
            os.rename(entry, target)
            continue
        log.info("removing %s (left by an interrupted write)", entry)
        _remove(entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------- files

@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path with the target's suffix; on success it replaces ``path``, on error it vanishes."""
    path = check_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    tmp = scratch_name(path, TMP_TAG, path.suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` written to ``path`` atomically, as UTF-8; gzip-compressed (mtime 0: equal text, equal bytes) where
    the name ends in ``.gz``."""
    if gzipped(Path(path)):
        return atomic_write_bytes(path, gzip_text(text))
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def dump_json(data: dict, path: str | os.PathLike | None = None) -> str:
    """Stable, standard JSON text of ``data`` (sorted keys, no NaN); written atomically to ``path`` when given."""
    text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False)
    if path is not None:
        atomic_write_text(path, text + "\n")
    return text


def compact_json_object(data: dict) -> str:
    """JSON text of ``data`` with one line per top-level key and each value compact (no NaN): a training log's
    30K-step history stays small while its header still reads line by line."""
    items = (f" {json.dumps(k)}: {json.dumps(v, separators=(',', ':'), allow_nan=False)}" for k, v in data.items())
    return "{\n" + ",\n".join(items) + "\n}\n"


def parse_json_object(text: str, what: str) -> dict:
    """``text`` parsed as one JSON object (standard JSON: NaN and Infinity are refused), else a ValueError."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{what} is not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(data).__name__}")
    return data


def _refuse_constant(name: str):
    raise json.JSONDecodeError(f"non-standard constant {name}", name, 0)


def read_json_file(path: str | os.PathLike, what: str | None = None) -> dict:
    """A JSON object read from the file ``path``, gzip-compressed where its name ends in ``.gz`` (one-line
    ValueError for a missing, binary, damaged or invalid file)."""
    path = Path(path)
    what = what or str(path)
    if not path.is_file():
        raise ValueError(f"{what}: no such file")
    data = path.read_bytes()
    if gzipped(path):
        import gzip
        import zlib

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; a cut stream an EOFError
            raise ValueError(f"{what} is not a whole gzip file ({exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text") from None
    return parse_json_object(text, what)


@contextmanager
def locked_append(path: str | os.PathLike):
    """``path`` opened for appending text by one writer at a time: a second one gets a one-line UserError. A name
    ending in ``.gz`` takes each ``write`` as one gzip member (:class:`GzipMemberWriter`)."""
    import fcntl  # POSIX only, like the rest of the crash-safety machinery

    path = check_output(path)
    gz = gzipped(path)
    with path.open("ab" if gz else "a", **({} if gz else {"encoding": "utf-8"})) as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another process is writing {path}; wait for it to finish or choose another file") \
                from None
        try:
            yield GzipMemberWriter(fh) if gz else fh
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def gzipped(path: Path) -> bool:
    """Whether a file diffquant writes or reads is gzip-compressed, for its writer and its reader alike: its name
    ends in ``.gz`` (any case)."""
    return path.suffix.lower() == ".gz"


def gzip_text(text: str) -> bytes:
    """``text`` as one complete gzip member of its UTF-8 bytes; mtime 0, so equal text gives equal bytes."""
    import gzip  # lazy: only compressed outputs need it

    return gzip.compress(text.encode("utf-8"), mtime=0)


def compressed_name(plain: Path) -> Path:
    """Where a result named ``plain`` is written: ``plain.gz``, compressed; ``plain`` itself where only that
    exists (an older output, read and extended where it is)."""
    compressed = plain.with_name(plain.name + ".gz")
    return plain if plain.is_file() and not compressed.exists() else compressed


class GzipMemberWriter:
    """A binary file taking text: each ``write`` appended as one complete gzip member, so a crash can cut only the
    last member (which the reader skips), and concatenated members are one valid gzip file."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, text: str) -> int:
        return self._fh.write(gzip_text(text))

    def flush(self) -> None:
        self._fh.flush()

    def fileno(self) -> int:
        return self._fh.fileno()


class JsonConfig:
    """JSON round trip of a config dataclass with ``to_dict`` / ``from_dict``: text and files are separate ways
    in, so text is never taken for a path (``from_json`` takes a ``str`` as text, a path object as a file)."""

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        return dump_json(self.to_dict(), path)

    @classmethod
    def from_json_text(cls, text: str):
        return cls.from_dict(parse_json_object(text, f"{cls.__name__} JSON"))

    @classmethod
    def from_json_file(cls, path: str | os.PathLike):
        return cls.from_dict(read_json_file(path))

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike):
        if isinstance(text_or_path, os.PathLike):
            return cls.from_json_file(text_or_path)
        return cls.from_json_text(text_or_path)


# ---------------------------------------------------------------------------------------------------- folders

class atomic_dir:
    """Context manager yielding a temporary folder that replaces ``target`` on success, vanishes on error."""

    def __init__(self, target: str | os.PathLike):
        self.target = Path(target)

    def __enter__(self) -> Path:
        check_output(self.target, folder=True)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(self.target)
        self.tmp = scratch_name(self.target, TMP_TAG)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                _make_readable(self.tmp)  # a checkpoint should read like any other folder
                replace_dir(self.tmp, self.target)
        finally:
            _remove(self.tmp)  # after an exchange it holds the old version


def replace_dir(new: Path, target: Path) -> None:
    """Make ``new`` visible as ``target``; an existing ``target`` ends up at ``new``'s path (to be removed)."""
    if not target.exists():
        os.rename(new, target)
    elif not exchange(new, target):
        _replace_by_two_renames(new, target)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one system call; False where the platform or file system cannot."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):  # EPERM: a seccomp filter may say so
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _replace_by_two_renames(new: Path, target: Path) -> None:
    old = scratch_name(target, OLD_TAG)
    os.rename(target, old)  # a kill from here to the next rename is repaired by clean_stale()
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    os.rename(old, new)  # the caller removes new


def _make_readable(folder: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    for p in [folder, *folder.rglob("*")]:
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


# ---------------------------------------------------------------------------------------------------- the output rule

_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))


def check_output(path: str | os.PathLike, folder: bool | None = False, flag: str | None = None) -> Path:
    """``path`` if a writer may create or replace it: absent, a regular file (``folder`` False) or a folder
    (``folder`` True; None: either). Anything else — a FIFO, a device node, a socket, a file where a folder goes
    — is refused with a one-line UserError before anything is touched (``os.replace`` over ``/dev/null`` would
    replace the device itself; opening a FIFO blocks). Symbolic links are judged by what they point to."""
    path = Path(path)
    name = f"{flag} {path}" if flag else str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise UserError(f"{name}: cannot be written ({exc.strerror.lower()})") from None
    for test, what in _SPECIAL:
        if test(mode):
            raise UserError(f"{name} is {what}: diffquant only writes regular files and folders; choose another "
                            "path")
    if folder is True and not stat.S_ISDIR(mode):
        raise UserError(f"{name} exists and is not a folder; choose another path")
    if folder is False and stat.S_ISDIR(mode):
        raise UserError(f"{name} is a folder; give a file name")
    return path


def check_outputs(outputs: Mapping[str, Iterable[str | os.PathLike]]) -> None:
    """:func:`check_output` for every output of a command line (flag -> paths), before any work is done."""
    for flag, paths in outputs.items():
        for path in paths:
            check_output(path, folder=None, flag=flag)


# ---------------------------------------------------------------------------------------------------- the input rule

def refuse_overlap(inputs: Mapping[str, Iterable[str | os.PathLike]],
                   outputs: Mapping[str, Iterable[str | os.PathLike]]) -> None:
    """Refuse (UserError) any output that equals, lies inside or contains an input.

    ``inputs`` / ``outputs``: flag name -> paths. Inputs that do not exist are ignored (names such as ``test``
    that mean a data split, not a file); outputs are compared as they would be created (symlinks resolved).
    """
    sources = [(flag, Path(p).resolve()) for flag, paths in inputs.items() for p in paths if Path(p).exists()]
    for out_flag, paths in outputs.items():
        for out in paths:
            dst = Path(out).resolve()
            for in_flag, src in sources:
                relation = _relation(src, dst)
                if relation:
                    raise UserError(f"{out_flag} {out} {relation} the input {in_flag} {src}: no output may replace, "
                                    "enter or enclose an input")


def _relation(src: Path, dst: Path) -> str | None:
    if dst == src:
        return "is"
    if src in dst.parents:
        return "lies inside"
    if dst in src.parents:
        return "contains"
    return None


# ---------------------------------------------------------------------------------------------------- safetensors

def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors file with its JSON header written with sorted keys (the Rust writer orders the
    metadata by a random hash): equal tensors and metadata give byte-identical files."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    text = json.dumps(_sorted(header), separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


def _sorted(header: dict) -> dict:
    meta = header.get("__metadata__")
    return {**header, "__metadata__": dict(sorted(meta.items()))} if meta else header


def write_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """``tensors`` as a canonical safetensors file, written atomically; NaN/Inf floats are refused."""
    from safetensors.torch import save  # lazy: io is imported by light modules

    for name, t in tensors.items():  # no reader accepts NaN/Inf weights: refuse them here, not at the next load
        if t.is_floating_point() and t.numel() and not bool(t.isfinite().all()):
            hint = " (|values| above 65504 overflow float16)" if str(t.dtype) == "torch.float16" else ""
            raise UserError(f"refusing to write {path}: tensor {name} holds NaN or Inf{hint}")
    return atomic_write_bytes(path, canonical_safetensors(save(tensors, metadata=metadata)))


def finite_or_none(value):
    """``value`` with every non-finite float replaced by None (records stay standard JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


__all__ = ["JsonConfig", "atomic_dir", "atomic_path", "atomic_write_bytes", "atomic_write_text",
           "canonical_safetensors", "check_output", "check_outputs", "clean_stale", "compact_json_object",
           "dump_json", "exchange", "finite_or_none", "locked_append",
           "parse_json_object", "read_json_file", "refuse_overlap", "replace_dir", "scratch_name", "write_safetensors"]
