"""Checkpoints: a folder with ``config.json`` + ``model.safetensors``; no pickle anywhere.

Writes are atomic (a temporary folder beside the target, then a rename) and never overwrite a non-empty
folder unless asked. Loading validates everything it reads and raises ``CheckpointError`` with a one-line
message for a missing or corrupt file, a config that does not match the tensors, or non-finite weights.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .model import LM, build_model

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not describe a valid model (one-line message)."""


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
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", **(metadata or {})})
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


class atomic_dir:
    """Context manager yielding a temporary folder that replaces ``target`` on success, vanishes on error."""

    def __init__(self, target: str | Path):
        self.target = Path(target)

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        _make_readable(self.tmp)  # mkdtemp creates 0700; a checkpoint should read like any other folder
        old = None
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
            os.replace(self.target, old)
        os.replace(self.tmp, self.target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    for p in [folder, *folder.rglob("*")]:
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    attn_impl: str | None = None,
) -> LM:
    """Load a checkpoint folder (or a Llama-architecture ``.gguf`` file) into a model in eval mode."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
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


def _load_folder(path: Path) -> LM:
    if not path.is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .gguf file")
    from . import hf  # imported lazily: an HF Llama / DiffLlama folder is converted on the way in

    if hf.is_hf_folder(path):
        return hf.load_hf(path)
    cfg = read_config(path)
    tensors = _read_tensors(path / WEIGHTS_FILE)
    model = build_model(cfg)
    expected = {k: v.shape for k, v in _state_for_saving(model, None).items()}
    _check_match(path, expected, tensors)
    model.load_state_dict(tensors, strict=False)  # strict=False only for the tied head, checked above
    return model


def read_config(path: Path) -> ModelConfig:
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} has no {CONFIG_FILE}")
    try:
        return ModelConfig.from_json(cfg_file.read_text())
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{cfg_file}: {exc}") from None


def _read_tensors(weights: Path) -> dict[str, torch.Tensor]:
    if not weights.is_file():
        raise CheckpointError(f"{weights.parent} has no {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{weights} is corrupt or truncated ({first_line})") from None
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{weights}: tensor {name} contains NaN or Inf")
    return tensors


def _check_match(path: Path, expected: dict[str, torch.Size], tensors: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + (
            [f"unexpected {', '.join(unexpected[:3])}"] if unexpected else [])
        raise CheckpointError(f"{path}: config does not match the weights ({'; '.join(parts)})")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise CheckpointError(
                f"{path}: config does not match the weights ({name} is {tuple(tensors[name].shape)}, "
                f"config expects {tuple(shape)})")


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata stored in a checkpoint's safetensors header (e.g. training provenance)."""
    with safe_open(str(Path(path) / WEIGHTS_FILE), framework="pt") as fh:
        return dict(fh.metadata() or {})
