"""Read a compressed-tensors HF folder (Llama / DiffLlama, ``pack-quantized`` int weights) as our float model.

The folders :mod:`diffquant.compressed` writes, and llm-compressor's of the same scheme: each quantized Linear
stores ``weight_packed`` (signed codes + 2**(b-1), packed little-endian into int32 words), ``weight_scale``
[out, groups] and ``weight_shape``. The model gets the dequantized weight ``q · scale`` (exact in float32: a code
of at most 8 bits times a float16 / float32 scale), so it scores as stored. Symmetric int weights only; a
folder with zero points, activation quantization or another format is refused in one line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig
from ..model import LM, build_model
from .files import CONFIG_FILE, CheckpointError, read_json, read_tensors
from .hf import config_from_hf, from_hf_state_dict, weight_files

log = logging.getLogger(__name__)

QUANT_METHOD = "compressed-tensors"
PACKED_FORMAT = "pack-quantized"


def is_compressed_folder(path: str | Path) -> bool:
    """An HF folder whose config.json declares compressed-tensors quantization."""
    file = Path(path) / CONFIG_FILE
    try:
        qc = read_json(file).get("quantization_config") if file.is_file() else None
    except CheckpointError:
        return False
    return isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD


def read_compressed_config(path: str | Path) -> ModelConfig:
    return config_from_hf(_float_config(read_json(Path(path) / CONFIG_FILE)), str(path))


def compressed_scheme(path: str | Path) -> dict:
    """HF module name (or class name, ``Linear``) -> its weights' arguments, from ``quantization_config``."""
    qc = read_json(Path(path) / CONFIG_FILE)["quantization_config"]
    if qc.get("format") != PACKED_FORMAT:
        raise CheckpointError(f"{path}: compressed-tensors format {qc.get('format')!r} is not read "
                              f"(only {PACKED_FORMAT})")
    targets = {}
    for name, group in (qc.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if group.get("input_activations") or group.get("output_activations"):
            raise CheckpointError(f"{path}: {name} quantizes activations, which diffquant does not read")
        if weights.get("type", "int") != "int" or not weights.get("symmetric", True):
            raise CheckpointError(f"{path}: {name} holds {weights.get('type')} / asymmetric weights; only "
                                  "symmetric int weights are read")
        targets.update(dict.fromkeys(group.get("targets") or [], weights))
    return targets


def load_compressed(path: str | Path) -> LM:
    """Our model holding the folder's dequantized weights (float), in eval mode."""
    path = Path(path)
    hf = read_json(path / CONFIG_FILE)
    cfg = config_from_hf(_float_config(hf), str(path))
    targets = compressed_scheme(path)
    tensors = {}
    for file in weight_files(path):
        tensors.update(read_tensors(file))
    for key in [k for k in tensors if k.endswith(".weight_packed")]:
        module = key.removesuffix(".weight_packed")
        weights = targets.get(module) or targets.get("Linear")
        if weights is None:
            raise CheckpointError(f"{path}: {module} is packed but no config group names it")
        tensors[f"{module}.weight"] = _dequantize(path, module, tensors, int(weights["num_bits"]))
    model = build_model(cfg)
    model.load_state_dict(from_hf_state_dict(tensors, cfg, str(path)), strict=False)  # tied head: checked
    log.info("loaded compressed-tensors %s (%d packed Linear layers, dequantized)", path,
             sum(k.endswith(".weight_packed") for k in tensors))
    return model.eval()


def _float_config(hf: dict) -> dict:
    return {k: v for k, v in hf.items() if k != "quantization_config"}


def _dequantize(path: Path, module: str, tensors: dict, bits: int) -> torch.Tensor:
    packed = tensors.pop(f"{module}.weight_packed")
    scale = tensors.pop(f"{module}.weight_scale").float()
    shape = tensors.pop(f"{module}.weight_shape", None)
    if f"{module}.weight_zero_point" in tensors:
        raise CheckpointError(f"{path}: {module} has zero points; only symmetric weights are read")
    rows, cols = (int(n) for n in shape) if shape is not None else (packed.shape[0], scale.shape[1])
    if not 2 <= bits <= 8 or packed.shape != (rows, -(-cols * bits // 32)) or scale.shape[0] != rows \
            or cols % scale.shape[1]:
        raise CheckpointError(f"{path}: {module}'s packed weight, scale and shape do not agree")
    q = torch.from_numpy(unpack_int32(packed.numpy(), bits, cols))
    return q.float() * scale.repeat_interleave(cols // scale.shape[1], dim=1)  # (rows, cols)


def unpack_int32(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Signed codes [rows, cols] from compressed-tensors' int32 words (inverse of its ``pack_to_int32``)."""
    rows = words.shape[0]
    stream = np.unpackbits(np.ascontiguousarray(words).astype("<i4").view(np.uint8), axis=1, bitorder="little")
    planes = stream[:, :cols * bits].reshape(rows, cols, bits).astype(np.int64)
    return (planes << np.arange(bits)).sum(axis=2) - (1 << (bits - 1))
