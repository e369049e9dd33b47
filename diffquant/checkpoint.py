"""Checkpoints: a folder with ``config.json`` + ``model.safetensors``; no pickle anywhere.

Writes are atomic (:class:`diffquant.io.atomic_dir`) and never overwrite a non-empty folder unless asked.
Loading checks before it allocates: the config's values and sizes, the safetensors header against the file's
size, and the config against the declared tensor names, shapes and dtypes, all before a tensor is read or a
model is built. Anything wrong raises ``CheckpointError`` with a one-line message (also for non-finite weights).
"""

from __future__ import annotations

import logging
import math
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .config import ModelConfig
from .errors import UserError, first_line
from .io import atomic_dir, parse_json_object, read_json_file, write_safetensors
from .model import LM, build_model

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # sharded HF weights


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not describe a valid model (one-line message)."""


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
_ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def save_checkpoint(
    model: LM, path: str | Path, overwrite: bool = False, dtype: torch.dtype | None = None,
    metadata: dict[str, str] | None = None, files: dict[str, str | Path] | None = None,
) -> Path:
    """Write ``model`` to the folder ``path`` (optionally cast to ``dtype``, e.g. fp16 for shipping); ``files``
    (name -> source path, e.g. the tokenizer) are copied in beside the weights."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise CheckpointError(f"{path} is not empty; pass overwrite=True to replace it")
    tensors = _state_for_saving(model, dtype)
    with atomic_dir(path) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt", **(metadata or {})})
        (tmp / CONFIG_FILE).write_text(model.config.to_json() + "\n")
        for name, source in (files or {}).items():
            shutil.copyfile(source, tmp / name)
    log.info("saved %s (%d tensors)", path, len(tensors))
    return path


def _state_for_saving(model: LM, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("head.weight")  # the same storage as embed.weight; safetensors refuses shared tensors
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
            for k, v in state.items()}


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    attn_impl: str | None = None,
) -> LM:
    """Load a checkpoint folder (or a Llama-architecture ``.gguf`` file) into a model in eval mode."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    refuse_pickle(path)
    if path.is_dir() and (path / "quant.json").is_file():
        from .quant.packed import load_quantized  # lazy: packed quantized checkpoints (quant.json + codes)

        return load_quantized(path, device, dtype, attn_impl)
    if path.is_file() and path.suffix == ".gguf":
        from .gguf import load_gguf  # imported lazily: only GGUF users need the gguf package

        model = load_gguf(path)
    else:
        model = _load_folder(path)
    if attn_impl is not None:
        model.set_attn_impl(attn_impl)
    return model.to(device=device, dtype=dtype).eval()


def refuse_pickle(path: Path) -> None:
    """No command reads pickle files: a pickle file, or a folder whose only weights are pickles, is refused."""
    pickles = [path] if path.suffix in PICKLE_SUFFIXES else []
    if path.is_dir() and not any((path / name).is_file() for name in (WEIGHTS_FILE, INDEX_FILE)):
        pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{path}: {pickles[0].name} is a pickle file; diffquant never reads pickle files "
                              "(convert the weights to safetensors)")


def _load_folder(path: Path) -> LM:
    if not path.is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .gguf file")
    from . import hf  # imported lazily: an HF Llama / DiffLlama folder is converted on the way in

    if hf.is_hf_folder(path):
        return hf.load_hf(path)
    cfg = read_config(path)
    weights = path / WEIGHTS_FILE
    check_header(path, expected_shapes(cfg), read_header(weights), dtypes=FLOAT_DTYPES)
    tensors = _read_tensors(weights)
    model = build_model(cfg)
    model.load_state_dict(tensors, strict=False)  # strict=False only for the tied head, checked above
    return model


def read_model_config(path: str | Path) -> ModelConfig:
    """A checkpoint's config without reading its weights: our folder, packed folder, HF folder or .gguf file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    refuse_pickle(path)
    if path.is_file() and path.suffix == ".gguf":
        from .gguf import read_gguf_config

        return read_gguf_config(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .gguf file")
    from . import hf

    if hf.is_hf_folder(path):
        return hf.config_from_hf(hf._read_json(path / CONFIG_FILE), str(path))
    return read_config(path)


def expected_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Name -> shape of every tensor a checkpoint of ``cfg`` holds, from a model built on the meta device."""
    with torch.device("meta"):
        model = build_model(cfg)
    return {k: v.shape for k, v in _state_for_saving(model, None).items()}


def read_config(path: Path) -> ModelConfig:
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} has no {CONFIG_FILE}")
    try:
        return ModelConfig.from_dict(read_json_file(cfg_file))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{cfg_file}: {first_line(exc)}") from None


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


def _read_tensors(weights: Path) -> dict[str, torch.Tensor]:
    read_header(weights)  # sizes checked before any tensor is read
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{weights} is corrupt or truncated ({first_line(exc)})") from None
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{weights}: tensor {name} contains NaN or Inf")
    return tensors


def check_header(path: Path, expected: dict[str, torch.Size], found: dict[str, TensorInfo],
                 dtypes: tuple[str, ...] | None = None) -> None:
    """The declared tensors against what the config expects (names, shapes, and optionally dtypes)."""
    _check_match(path, expected, {k: torch.Size(v.shape) for k, v in found.items()})
    for name, info in found.items():
        if dtypes is not None and info.dtype not in dtypes:
            raise CheckpointError(f"{path}: tensor {name} is {info.dtype}; expected a float type "
                                  f"({', '.join(dtypes)})")


def _check_match(path: Path, expected: dict[str, torch.Size], shapes: dict[str, torch.Size]) -> None:
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + (
            [f"unexpected {', '.join(unexpected[:3])}"] if unexpected else [])
        raise CheckpointError(f"{path}: config does not match the weights ({'; '.join(parts)})")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise CheckpointError(
                f"{path}: config does not match the weights ({name} is {tuple(shapes[name])}, "
                f"config expects {tuple(shape)})")


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata stored in a checkpoint's safetensors header (e.g. training provenance)."""
    weights = Path(path) / WEIGHTS_FILE
    read_header(weights)
    with safe_open(str(weights), framework="pt") as fh:
        return dict(fh.metadata() or {})


# -- training context --------------------------------------------------------------------------------------

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
    import hashlib

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
