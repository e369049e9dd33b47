"""Checkpoints: one dispatcher over one module per format, beside the file helpers they share.

==============  =================================================================================================
``files``       CheckpointError, atomic folder writes with the overwrite guard, safetensors / JSON reading, checks
``native``      our folder: ``config.json`` + ``model.safetensors``
``packed``      a packed quantized folder: the native files' shape + ``quant.json`` (codes, scales, schemes)
``gguf``        a Llama-architecture ``.gguf`` file (F32 / F16), read only
``hf``          a Hugging Face Llama / DiffLlama folder, both ways
``compressed``  a compressed-tensors HF folder (pack-quantized int weights), read as its dequantized model
``context``     the sequence length a checkpoint was trained at, where known
==============  =================================================================================================

Format modules import ``files`` (and ``native`` for the model's expected shapes), never this dispatcher, so
the import graph has no cycle. No pickle is read anywhere; every write is atomic.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig
from ..model import LM
from .compressed import is_compressed_folder, load_compressed, read_compressed_config
from .context import training_context
from .files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    atomic_folder,
    check_writable,
    read_metadata,
    refuse_pickle,
)
from .gguf import load_gguf, read_gguf_config
from .hf import is_hf_folder, load_hf, read_hf_config
from .native import expected_shapes, load_native, read_config, save_checkpoint
from .packed import QUANT_FILE, load_quantized, save_quantized

FORMATS = ("native", "packed", "gguf", "hf", "compressed")
QUANTIZED_FORMATS = ("packed", "compressed")  # hold quantized weights as stored
_LOADERS = {"native": load_native, "gguf": load_gguf, "hf": load_hf, "compressed": load_compressed}
_CONFIG_READERS = {"native": read_config, "packed": read_config, "gguf": read_gguf_config, "hf": read_hf_config,
                   "compressed": read_compressed_config}


def checkpoint_format(path: str | Path) -> str:
    """Which of :data:`FORMATS` the checkpoint at ``path`` is (pickles and unknown paths refused)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    refuse_pickle(path)
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if not path.is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .gguf file")
    if (path / QUANT_FILE).is_file():
        return "packed"
    if not is_hf_folder(path):
        return "native"
    return "compressed" if is_compressed_folder(path) else "hf"


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    attn_impl: str | None = None,
) -> LM:
    """Load any checkpoint (native, packed or HF folder, or Llama ``.gguf`` file) into a model in eval mode."""
    fmt = checkpoint_format(path)
    if fmt == "packed":
        return load_quantized(path, device, dtype, attn_impl)  # refuses fused attention for attention quantizers
    model = _LOADERS[fmt](Path(path))
    if attn_impl is not None:
        model.set_attn_impl(attn_impl)
    return model.to(device=device, dtype=dtype).eval()


def read_model_config(path: str | Path) -> ModelConfig:
    """A checkpoint's config without reading its weights, whatever its format."""
    return _CONFIG_READERS[checkpoint_format(path)](Path(path))


__all__ = [
    "CONFIG_FILE", "FORMATS", "QUANTIZED_FORMATS", "QUANT_FILE", "WEIGHTS_FILE", "CheckpointError", "atomic_folder",
    "check_writable",
    "checkpoint_format", "expected_shapes", "load_checkpoint", "load_quantized", "read_config", "read_metadata",
    "read_model_config", "save_checkpoint", "save_quantized", "training_context",
]
