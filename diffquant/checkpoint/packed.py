"""Packed quantized checkpoints: an ordinary safetensors state dict + the base ``config.json`` + ``quant.json``.

Layout of a folder written by :func:`save_quantized`::

    config.json        the float model's ModelConfig (the skeleton to rebuild)
    model.safetensors  the quantized model's state dict: QuantLinear / QuantEmbedding buffers (codes packed as
                       described in linear.py, scales, zeros), float tensors of everything not quantized,
                       each weight method's own tensors (e.g. bitsandbytes statistics); a tensor
                       shared by two names is stored once
    quant.json         {"format": "diffquant-packed", "version": 1, "quant_config": QuantConfig or null,
                        "modules": {name: scheme}, "shared": {name: stored name}, "notes": {...}}

Every setting comes from quant.json's per-module schemes (bits, group size, symmetry, storage, activation
quantizers), never from tensor names. Loading builds the float skeleton from config.json, swaps in empty quantized
modules as the schemes say (each module type's weight method builds it, :mod:`diffquant.quant.registry`;
:func:`restore_quantized_` knows nothing about the model code) and loads the
state dict, checking every key, so outputs equal the in-memory quantized model's exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save
from torch import nn

from ..io import write_safetensors
from ..kinds import ATTENTION_KINDS, upgrade_legacy_granularities
from ..model import build_model
from ..quant.act import InputQuantLinear, QuantProbe
from ..quant.api import iter_quantized, tie_packed
from ..quant.config import ActQuant, QuantConfig
from ..quant.linear import _PackedWeight
from ..quant.registry import method_for_module, method_for_type
from .files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    atomic_folder,
    check_capacity,
    name_mismatch,
    read_json,
    read_metadata,
    read_tensors,
)
from .native import expected_shapes, read_config
from .packed_check import check_codes, check_schemes

log = logging.getLogger(__name__)

__all__ = ["QUANT_FILE", "fp16_file_bytes", "load_quantized", "read_quant_info", "restore_quantized_", "save_quantized"]

QUANT_FILE = "quant.json"
FORMAT, VERSION = "diffquant-packed", 1
SCHEME_DIGEST = "diffquant_scheme_sha256"  # safetensors metadata: ties the codes to quant.json's description
NOTES = {
    "codes": "qweight holds unsigned codes: code = stored + qmin, qmin = -(2**(bits-1)-1) if symmetric else 0",
    "uint4x2": "codes of <= 4 bits, two per byte: low nibble = even input column, high nibble = odd column",
    "uint8": "codes of 5-8 bits (e.g. 6-bit) stored one per byte, unpacked",
    "weight": "W = (code - zero) * scale, scale/zero [out, n_groups]; groups are contiguous input columns",
}


# ----------------------------------------------------------------------------- saving


def save_quantized(model: nn.Module, path: str | Path, overwrite: bool = False, dtype: torch.dtype | None = None,
                   metadata: dict[str, str] | None = None, extra_files: dict[str, Path] | None = None) -> Path:
    """Write the quantized ``model`` (a diffquant model after ``quantize_``) to the folder ``path``, atomically.

    ``dtype``: cast the float tensors (unquantized weights, norms, scales) to it, e.g. fp16 for shipping; codes
    are never touched. ``extra_files``: name in the folder -> file to copy there (e.g. the tokenizer), inside
    the same atomic write.
    """
    path = Path(path)
    config_json = getattr(getattr(model, "config", None), "to_json", None)
    if config_json is None:
        raise ValueError("packed checkpoints are written for diffquant models (model.config.to_json())")
    tensors, shared = _dedupe(model.state_dict())
    modules = {name: module_scheme(m) for name, m in iter_quantized(model)}
    if dtype is not None:
        # bitsandbytes' own statistics (absmax, SCB, quant maps) keep their dtype: they are part of its format.
        keep = tuple(f"{n}." for n, sch in modules.items() if _keeps_float_dtype(sch["type"]))
        tensors = {k: v.to(dtype) if v.is_floating_point() and not k.startswith(keep) else v
                   for k, v in tensors.items()}
    info = {
        "format": FORMAT, "version": VERSION,
        "quant_config": None if getattr(model, "quant_config", None) is None else model.quant_config.to_dict(),
        "modules": modules,
        "shared": shared, "notes": NOTES,
    }
    metadata = {"format": "pt", "diffquant": FORMAT, **(metadata or {}), SCHEME_DIGEST: scheme_digest(info)}
    with atomic_folder(path, overwrite) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata=metadata)
        (tmp / CONFIG_FILE).write_text(config_json() + "\n")
        (tmp / QUANT_FILE).write_text(json.dumps(info, indent=2) + "\n")
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, tmp / name)
    log.info("saved packed checkpoint %s (%d tensors, %d quantized modules)", path, len(tensors), len(info["modules"]))
    return path


def scheme_digest(info: dict) -> str:
    """sha256 of what decides how the stored codes are read (schemes, shared names, quant config)."""
    described = {k: info.get(k) for k in ("modules", "shared", "quant_config")}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _check_digest(path: Path, info: dict) -> None:
    """quant.json must still describe the codes it was written with (an edited bit width would misread them)."""
    stored = read_metadata(path).get(SCHEME_DIGEST)
    if stored is None:
        log.warning("%s: written before scheme digests; quant.json cannot be checked against the codes", path)
    elif stored != scheme_digest(info):
        raise CheckpointError(f"{path / QUANT_FILE} was changed after the weights were written: its schemes no "
                                "longer describe the stored codes")


def fp16_file_bytes(model: nn.Module) -> int:
    """Size of the model's state dict as an fp16 safetensors file (shared tensors once): the size baseline."""
    tensors, _ = _dedupe(model.state_dict())
    return len(save({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}))


def module_scheme(module: nn.Module) -> dict:
    method = method_for_module(module)
    return module.scheme() if method is None else method.scheme(module)


def _keeps_float_dtype(module_type: str) -> bool:
    method = method_for_type(module_type)
    return method is not None and method.keeps_float_dtype


def _dedupe(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store a tensor shared by several names (tied head, tied codes) once; record the other names."""
    kept: dict[tuple, str] = {}
    tensors, shared = {}, {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
               t.dtype)
        if t.numel() and key in kept:
            shared[name] = kept[key]
            continue
        kept[key] = name
        tensors[name] = t.detach().contiguous()
    return tensors, shared


# ----------------------------------------------------------------------------- loading


def read_quant_info(path: str | Path) -> dict:
    """The parsed and checked ``quant.json`` of a packed checkpoint folder."""
    qfile = Path(path) / QUANT_FILE
    info = read_json(qfile)
    if info.get("format") != FORMAT:
        raise CheckpointError(f"{qfile} is not a {FORMAT} description")
    if info.get("version") != VERSION:
        raise CheckpointError(f"{qfile} has version {info.get('version')!r}; this diffquant reads {VERSION}")
    if not isinstance(info.get("modules"), dict) or not isinstance(info.get("shared", {}), dict):
        raise CheckpointError(f"{qfile}: 'modules' and 'shared' must be objects")
    return info


def load_quantized(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   attn_impl: str | None = None) -> nn.Module:
    """Rebuild the quantized diffquant model saved in the folder ``path`` (eval mode).

    :func:`diffquant.checkpoint.load_checkpoint` calls this for folders holding a quant.json.
    """
    path = Path(path)
    info = read_quant_info(path)
    cfg = read_config(path)
    check_capacity(path, sum(math.prod(s) for s in expected_shapes(cfg).values()), [path / WEIGHTS_FILE])
    model = build_model(cfg)

    restore_quantized_(model, info, read_tensors(path / WEIGHTS_FILE), where=str(path))
    _check_digest(path, info)
    if attn_impl is not None and attn_impl != "eager" and _has_attention_quantizers(model):
        raise CheckpointError(f"{path} quantizes attention tensors, which exist only with attn_impl='eager'")
    if attn_impl is not None:
        model.set_attn_impl(attn_impl)
    return model.to(device=device, dtype=dtype).eval()


def _has_attention_quantizers(model: nn.Module) -> bool:
    return any(isinstance(m, QuantProbe) and m.kind in ATTENTION_KINDS for m in model.modules())


def restore_quantized_(model: nn.Module, info: dict, tensors: dict[str, torch.Tensor], where: str = "") -> nn.Module:
    """Turn the float skeleton ``model`` into the quantized model described by ``info`` and load ``tensors``.

    Model-agnostic: modules are found by name and swapped by the type recorded in their scheme.
    """
    where = where or "packed checkpoint"
    info = upgrade_legacy_granularities(info)  # quant.json written before an activation granularity was renamed
    check_schemes(model, info["modules"], where)  # before any quantized buffer is allocated
    for name, scheme in info["modules"].items():
        try:
            model.set_submodule(name, _empty_module(model, name, scheme, tensors))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: cannot rebuild module {name} ({exc})") from None
    shared = info.get("shared", {})
    state = dict(tensors)
    for alias, source in shared.items():
        if source not in state:
            raise CheckpointError(f"{where}: shared tensor {alias} points to missing {source}")
        state[alias] = state[source]
    _check_keys(model, state, where)
    check_codes(info["modules"], state, where)
    result = model.load_state_dict(state, strict=False)  # bnb 4-bit layers were built from their extra keys
    prebuilt = tuple(f"{n}.weight." for n, s in info["modules"].items()
                     if getattr(method_for_type(s.get("type")), "loads_extra_keys", False))
    leftover = [k for k in result.unexpected_keys if not k.startswith(prebuilt)]
    if result.missing_keys or leftover:
        raise CheckpointError(f"{where}: tensors not loaded ({', '.join((result.missing_keys + leftover)[:3])})")
    _retie(model, shared)
    if info.get("quant_config") is not None:
        model.quant_config = QuantConfig.from_dict(info["quant_config"])
    return model


def _act(scheme: dict) -> ActQuant | None:
    return None if scheme.get("act") is None else ActQuant.from_dict(scheme["act"])


def _empty_module(model: nn.Module, name: str, scheme: dict, tensors: dict[str, torch.Tensor]) -> nn.Module:
    kind = scheme.get("type")
    old = model.get_submodule(name)
    if kind == "QuantProbe":
        if getattr(old, "kind", None) != scheme["kind"]:
            raise ValueError(f"the model has no {scheme['kind']} probe there")
        return QuantProbe(scheme["kind"], _act(scheme))
    if kind == "InputQuantLinear":
        return InputQuantLinear.from_linear(old, _act(scheme))
    method = method_for_type(kind) if isinstance(kind, str) else None
    if method is None:
        raise ValueError(f"unknown module type {kind!r}")
    return method.empty_module(old, scheme, tensors, name)


def _check_keys(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    expected = {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{where}: quant.json does not match the weights ({name_mismatch(missing, unexpected)})")
    for name, (shape, dtype) in expected.items():
        t = state[name]
        if t.shape != shape or (t.dtype != dtype and not (t.is_floating_point() and dtype.is_floating_point)):
            raise CheckpointError(
                f"{where}: quant.json does not match the weights ({name} is {tuple(t.shape)} {t.dtype}, "
                f"quant.json implies {tuple(shape)} {dtype})")


def _retie(model: nn.Module, shared: dict[str, str]) -> None:
    """Give aliases the very tensor of their source again (tied head and embedding share memory)."""
    packed_pairs = set()
    for alias, source in shared.items():
        a_mod, _, a_attr = alias.rpartition(".")
        s_mod, _, _ = source.rpartition(".")
        target, origin = model.get_submodule(a_mod), model.get_submodule(s_mod)
        if isinstance(target, _PackedWeight) and isinstance(origin, _PackedWeight):
            packed_pairs.add((s_mod, a_mod))
        elif a_attr in target._parameters:
            setattr(target, a_attr, _resolve(model, source))
    for s_mod, a_mod in packed_pairs:
        tie_packed(model.get_submodule(s_mod), model.get_submodule(a_mod))


def _resolve(model: nn.Module, name: str) -> nn.Parameter:
    mod, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(mod), attr)
