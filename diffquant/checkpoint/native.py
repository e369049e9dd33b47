"""The native format: a folder with ``config.json`` + ``model.safetensors`` (tied ``head.weight`` left out).

Loading checks before it allocates: the config's values and sizes, the safetensors header against the file's
size, and the config against the declared tensor names, shapes and dtypes, all before a tensor is read or a
model is built.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import first_line
from ..io import write_safetensors
from ..model import LM, build_model
from .files import (
    CONFIG_FILE,
    FLOAT_DTYPES,
    WEIGHTS_FILE,
    CheckpointError,
    atomic_folder,
    check_header,
    read_header,
    read_json,
    read_tensors,
)

log = logging.getLogger(__name__)


def save_checkpoint(
    model: LM, path: str | Path, overwrite: bool = False, dtype: torch.dtype | None = None,
    metadata: dict[str, str] | None = None, files: dict[str, str | Path] | None = None,
) -> Path:
    """Write ``model`` to the folder ``path`` (optionally cast to ``dtype``, e.g. fp16 for shipping); ``files``
    (name -> source path, e.g. the tokenizer) are copied in beside the weights."""
    path = Path(path)
    tensors = state_for_saving(model, dtype)
    with atomic_folder(path, overwrite) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt", **(metadata or {})})
        (tmp / CONFIG_FILE).write_text(model.config.to_json() + "\n")
        for name, source in (files or {}).items():
            shutil.copyfile(source, tmp / name)
    log.info("saved %s (%d tensors)", path, len(tensors))
    return path


def state_for_saving(model: LM, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The state dict as stored: tied head left out, floats cast to ``dtype``, contiguous."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("head.weight")  # the same storage as embed.weight; safetensors refuses shared tensors
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
            for k, v in state.items()}


def load_native(path: Path) -> LM:
    """A float model (train mode, CPU, float32) from a native checkpoint folder."""
    cfg = read_config(path)
    weights = path / WEIGHTS_FILE
    check_header(path, expected_shapes(cfg), read_header(weights), dtypes=FLOAT_DTYPES)
    tensors = read_tensors(weights)
    model = build_model(cfg)
    model.load_state_dict(tensors, strict=False)  # strict=False only for the tied head, checked above
    return model


def expected_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Name -> shape of every tensor a checkpoint of ``cfg`` holds, from a model built on the meta device."""
    with torch.device("meta"):
        model = build_model(cfg)
    return {k: v.shape for k, v in state_for_saving(model, None).items()}


def read_config(path: Path) -> ModelConfig:
    """The ``ModelConfig`` of a native (or packed) checkpoint folder."""
    cfg_file = path / CONFIG_FILE
    data = read_json(cfg_file)  # its errors name the file already
    try:
        return ModelConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{cfg_file}: {first_line(exc)}") from None
