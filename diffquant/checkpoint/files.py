"""The file helpers every checkpoint format shares; no format logic and no model code here.

* :class:`CheckpointError`: the one error for a checkpoint that cannot be read or written (one-line message).
* :func:`atomic_folder`: an atomic folder write (:class:`diffquant.io.atomic_dir`) that never replaces a
  non-empty folder unless asked.
* :func:`read_header` / :func:`read_tensors`: safetensors files checked against their size before any data is
  read, and NaN/Inf refused after; :func:`check_header` / :func:`check_shapes`: names and shapes against what
  a config expects; :func:`read_json`: a JSON object file; :func:`refuse_pickle`: no pickle anywhere.
* :func:`weights_here` / :func:`parked_weights` / :class:`WeightsParked`: checkpoints whose weights are not here
  (a final whose weights are parked in history keeps only its config and tokenizer).
"""

from __future__ import annotations

import math
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import UserError, first_line
from ..io import atomic_dir, parse_json_object, read_json_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # sharded HF weights
TOKENIZER_FILE = "tokenizer.json"  # an HF tokenizers file
SENTENCEPIECE_FILE = "tokenizer.model"  # a SentencePiece model


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not describe a valid model (one-line message)."""


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
_ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


class WeightsParked(FileNotFoundError):
    """Work that needs a checkpoint's weights, which are not here (parked in history); ``lacking`` says what the
    cached records lack that the weights would give."""

    def __init__(self, checkpoint: str, lacking: str):
        super().__init__(f"{checkpoint} has no weights here (parked?) and {lacking}")


def weights_here(checkpoint: str | Path) -> bool:
    """A checkpoint file, or a folder with its safetensors."""
    path = Path(checkpoint)
    return path.is_file() or any(path.glob("*.safetensors"))


def parked_weights(checkpoints, root: str | Path = ".") -> list[str]:
    """The ``checkpoints`` (paths, relative to ``root`` unless absolute) whose weights are not here, as given."""
    return [str(c) for c in checkpoints if not weights_here(Path(root) / c)]


# ---------------------------------------------------------------------------------------------------- writing

def check_writable(path: str | Path, overwrite: bool, hint: str = "pass overwrite=True to replace it") -> Path:
    """Refuse a ``path`` that is a file, or a non-empty folder unless ``overwrite``; checked before any work."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise CheckpointError(f"{path} is not empty; {hint}")
    return path


@contextmanager
def atomic_folder(path: str | Path, overwrite: bool = False):
    """A temporary folder that replaces ``path`` on success (vanishes on error), after :func:`check_writable`."""
    with atomic_dir(check_writable(path, overwrite)) as tmp:
        yield tmp


# ---------------------------------------------------------------------------------------------------- reading

def refuse_pickle(path: Path) -> None:
    """No command reads pickle files: a pickle file, or a folder whose only weights are pickles, is refused."""
    pickles = [path] if path.suffix in PICKLE_SUFFIXES else []
    if path.is_dir() and not any((path / name).is_file() for name in (WEIGHTS_FILE, INDEX_FILE)):
        pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{path}: {pickles[0].name} is a pickle file; diffquant never reads pickle files "
                              "(convert the weights to safetensors)")


def read_json(file: Path) -> dict:
    """A JSON object file of a checkpoint; a missing or invalid one raises CheckpointError."""
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {file.name}")
    try:
        return read_json_file(file)
    except ValueError as exc:
        raise CheckpointError(first_line(exc)) from None


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header declares it."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEM_BYTES[self.dtype]


def check_capacity(path: Path, parameters: int, files: list[Path]) -> None:
    """Refuse a config that describes more parameters than the weight files can hold at one bit each (codes
    packed below a byte included): a model that big would be allocated for weights that are not there."""
    stored_bits = 8 * sum(t.nbytes for file in files for t in read_header(file).values())
    if parameters > stored_bits:
        raise CheckpointError(f"{path}: config.json describes {parameters} parameters but the weights hold "
                              f"only {stored_bits // 8} bytes")


def read_header(weights: Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file declares, checked against the file's size before any data is read."""
    if not weights.is_file():
        raise CheckpointError(f"{weights.parent} has no {weights.name}")
    size = weights.stat().st_size
    with weights.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{weights} is corrupt or truncated (shorter than a safetensors header)")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise CheckpointError(f"{weights} is corrupt or truncated (header of {n} bytes in a {size}-byte file)")
        raw = fh.read(n)
    try:
        header = parse_json_object(raw.decode("utf-8"), "header")
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(f"{weights} is corrupt (its header is not a JSON object)") from None
    header.pop("__metadata__", None)
    return {name: _tensor_info(weights, name, entry, size - 8 - n) for name, entry in header.items()}


def _tensor_info(weights: Path, name: str, entry, data_bytes: int) -> TensorInfo:
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        ok = dtype in _ITEM_BYTES and all(isinstance(d, int) and d >= 0 for d in shape) and 0 <= begin <= end
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise CheckpointError(f"{weights} is corrupt (bad header entry for {name})")
    if end > data_bytes or end - begin != math.prod(shape) * _ITEM_BYTES[dtype]:
        raise CheckpointError(f"{weights} is corrupt or truncated ({name} declares {tuple(shape)} {dtype}, "
                              f"more than the file holds)")
    return TensorInfo(dtype, tuple(shape))


def read_tensors(weights: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, after :func:`read_header`'s checks; NaN/Inf floats are refused."""
    read_header(weights)  # sizes checked before any tensor is read
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{weights} is corrupt or truncated ({first_line(exc)})") from None
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{weights}: tensor {name} contains NaN or Inf")
    return tensors


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata stored in a checkpoint's safetensors header (e.g. training provenance)."""
    weights = Path(path) / WEIGHTS_FILE
    read_header(weights)
    with safe_open(str(weights), framework="pt") as fh:
        return dict(fh.metadata() or {})


# ---------------------------------------------------------------------------------------------------- checks

def check_header(path: Path, expected: dict[str, torch.Size], found: dict[str, TensorInfo],
                 dtypes: tuple[str, ...] | None = None) -> None:
    """The declared tensors against what the config expects (names, shapes, and optionally dtypes)."""
    check_shapes(path, expected, {k: torch.Size(v.shape) for k, v in found.items()})
    for name, info in found.items():
        if dtypes is not None and info.dtype not in dtypes:
            raise CheckpointError(f"{path}: tensor {name} is {info.dtype}; expected a float type "
                                  f"({', '.join(dtypes)})")


def check_shapes(path: Path, expected: dict[str, torch.Size], shapes: dict[str, torch.Size]) -> None:
    """The same tensor names as ``expected``, each with its expected shape."""
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path}: config does not match the weights ({name_mismatch(missing, unexpected)})")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise CheckpointError(
                f"{path}: config does not match the weights ({name} is {tuple(shapes[name])}, "
                f"config expects {tuple(shape)})")


def name_mismatch(missing: list[str], unexpected: list[str]) -> str:
    """``missing a, b, c; unexpected d`` (the first three of each) for a one-line message."""
    parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + (
        [f"unexpected {', '.join(unexpected[:3])}"] if unexpected else [])
    return "; ".join(parts)
