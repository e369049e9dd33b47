"""Quantized models as compressed-tensors HF folders (the llm-compressor / vLLM format transformers loads).

The folder is the float HF conversion of :mod:`diffquant.hf` (Llama or DiffLlama, same config, tokenizer and
row permutations) in which each quantized block Linear stores, instead of ``weight``, what compressed-tensors'
``pack-quantized`` compressor writes, and is written by that compressor itself
(``PackedQuantizationCompressor.compress``, from the ``compressed-tensors`` package of extra ``[export]``):

* ``weight_packed`` int32 [out, ceil(in·bits/32)]: signed codes q in [-2**(b-1), 2**(b-1)-1] offset by
  2**(b-1) and packed densely, element i at bits i·b … i·b+b-1 of a little-endian bit stream (32 elements per
  ``bits`` words, words may be split);
* ``weight_scale`` [out, n_groups] (strategy "channel": n_groups = 1, "group": in / group_size; a shorter last
  group is refused: compressed-tensors' group forward requires the group size to divide the width);
* ``weight_shape`` int64 [2]. The runtime computes ``W = q · scale`` (strategy "channel" or "group").

Our codes are written as they are (``q = code`` for absmax codes, ``q = code - 2**(b-1)`` for GPTQ's "full"
grid, whose zero point is that constant): nothing is re-rounded, and scales keep their stored dtype. The
compressor quantizes a float weight with the scales it is given (``round(w / s)``, clamped) before it packs; it is
handed our integer codes with unit scales, so what it packs is ``q`` itself, exactly, whatever our scales are
(a zero scale, which an all-zero group gets, would make its ``w / s`` NaN), and our scales are stored beside.
Asymmetric weights are refused: compressed-tensors 0.20 packs their zero points along the rows, but
transformers 5.24 then expects them unpacked (a size mismatch at load).
``quantization_config`` in config.json names the scheme per bit width / group size (one config group each).

Diff's head-norm weight is folded into o_proj's columns in DiffLlama, which a per-row/per-group scale cannot
absorb: a quantized out_proj is written dense (its dequantized weights, folded) and listed in ``ignore``,
unless the norm weight is all ones.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from .checkpoint import WEIGHTS_FILE, CheckpointError, atomic_folder
from .checkpoint.hf import ARCHITECTURES, SIDECAR_FILE, _row_maps, save_hf
from .exports import IntWeight, block_int_weights, check_weight_only, dequantized_copy, exactly_in
from .io import read_json_file, write_safetensors
from .model import LM

log = logging.getLogger(__name__)

__all__ = ["FORMAT", "pack_with_compressed_tensors", "quantization_config", "save_compressed"]

FORMAT = "pack-quantized"
DENSE_KEY = "diffquant_dense"  # safetensors metadata: the quantized Linears written dense (Diff's o_proj)
CT_VERSION = "0.20.1"  # the compressed-tensors release whose format this follows (its config "version")
_HF_LINEAR = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
              "attn.out_proj": "self_attn.o_proj", "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj",
              "mlp.down_proj": "mlp.down_proj"}


def hf_linear_name(ours: str) -> str:
    """``layers.3.attn.out_proj`` -> ``model.layers.3.self_attn.o_proj``."""
    _, index, rest = ours.split(".", 2)
    return f"model.layers.{index}.{_HF_LINEAR[rest]}"


def pack_with_compressed_tensors(q: torch.Tensor, args: dict) -> torch.Tensor:
    """``weight_packed`` of signed codes q [rows, cols] (weights ``args``), by compressed-tensors' own compressor
    (unit scales: it packs ``round(q / 1) = q``; see the module docstring)."""
    try:
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    except ImportError:
        raise CheckpointError("writing compressed-tensors folders needs the compressed-tensors package: "
                              "pip install 'diffquant[export]'") from None
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    groups = 1 if args["group_size"] is None else q.shape[1] // args["group_size"]
    unit = torch.ones(q.shape[0], groups, dtype=torch.float32)
    return PackedQuantizationCompressor.compress({"weight": q.float(), "weight_scale": unit}, scheme)["weight_packed"]


def _module_tensors(w: IntWeight, order: torch.Tensor | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """weight_packed / weight_scale / weight_shape of one (centered) Linear, rows in HF order."""
    q, scale = w.signed(), w.scale  # code - zero: the signed integer compressed-tensors stores
    if order is not None:
        q, scale = q[order], scale[order]
    return {"weight_packed": pack_with_compressed_tensors(q, _args(w)).contiguous(),
            "weight_scale": scale.to(dtype).contiguous(), "weight_shape": torch.tensor(tuple(w.codes.shape))}


def _args(w: IntWeight) -> dict:
    return {"num_bits": w.bits, "type": "int", "symmetric": True, "group_size": w.group_size,
            "strategy": "channel" if w.group_size is None else "group", "dynamic": False, "actorder": None,
            "block_structure": None, "observer": "minmax", "observer_kwargs": {}}


def quantization_config(schemes: dict[str, dict], ignore: list[str]) -> dict:
    """config.json's ``quantization_config``: one group per weight scheme, targets by HF module name."""
    groups = {f"group_{i}": {"targets": sorted(names), "weights": args, "input_activations": None,
                             "output_activations": None, "format": FORMAT}
              for i, (args, names) in enumerate(_grouped(schemes))}
    return {"quant_method": "compressed-tensors", "version": CT_VERSION, "format": FORMAT,
            "quantization_status": "compressed", "config_groups": groups, "ignore": sorted(ignore),
            "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {}, "transform_config": {}}


def _grouped(schemes: dict[str, dict]) -> list[tuple[dict, list[str]]]:
    groups: list[tuple[dict, list[str]]] = []
    for name, args in sorted(schemes.items()):
        for known, names in groups:
            if known == args:
                names.append(name)
                break
        else:
            groups.append((args, [name]))
    return groups


def save_compressed(model: LM, path: str | Path, tokenizer=None, overwrite: bool = False,
                    dtype: torch.dtype | None = None) -> Path:
    """Write the quantized ``model`` (RTN / GPTQ weights) as a compressed-tensors HF folder, atomically.

    Unquantized tensors (and any quantized embedding or head, dequantized) are float as in ``save_hf``;
    ``dtype`` casts them and the scales (refused when a scale would change).
    """
    cfg = model.config
    check_weight_only(model, "compressed-tensors")
    ints = block_int_weights(model)
    if not ints:
        raise CheckpointError("the model has no RTN / GPTQ quantized Linear layers to export")
    dtype = dtype or next(iter(ints.values())).scale.dtype
    for name, w in ints.items():
        if not w.centered():
            raise CheckpointError(f"{name} has asymmetric zero points, which this export does not write "
                                  "(transformers expects them unpacked, compressed-tensors packs them); "
                                  "quantize symmetrically")
        if w.ragged:
            raise CheckpointError(f"{name}: compressed-tensors groups must divide the input width, and "
                                  f"{w.group_size} does not divide {w.codes.shape[1]} (quantize with "
                                  f"{_dividing_sizes(ints.values())})")
        if not exactly_in(w.scale, dtype):
            raise CheckpointError(f"{name}'s scales are not exactly representable in {dtype} "
                                  "(export in float32, or quantize with --dtype float16)")
    float_model = dequantized_copy(model)
    dense = _dense_in_hf(cfg, float_model, ints)
    rows = _row_maps(cfg)
    quantized, schemes = {}, {}
    for name, w in ints.items():
        if name in dense:
            continue
        hf_name = hf_linear_name(name)
        order = rows.get(name.rsplit(".", 1)[1])
        for key, t in _module_tensors(w, order, dtype).items():
            quantized[f"{hf_name}.{key}"] = t
        schemes[hf_name] = _args(w)
    ignore = ["lm_head"] + [hf_linear_name(n) for n in dense]
    path = Path(path)
    with atomic_folder(path, overwrite) as tmp:
        tensors = _float_hf_into(tmp, float_model, tokenizer, dtype)
        kept = {k: v for k, v in tensors.items() if k.removesuffix(".weight") not in schemes}
        write_safetensors({**kept, **quantized}, tmp / WEIGHTS_FILE,
                          metadata={"format": "pt", DENSE_KEY: json.dumps([hf_linear_name(n) for n in dense])})
        _add_quantization_config(tmp, quantization_config(schemes, ignore))
    log.info("saved %s as compressed-tensors %s (%d quantized Linear layers, %d dense)", path,
             ARCHITECTURES[cfg.arch][1], len(schemes), len(dense))
    if dense:
        log.warning("%s: %d quantized o_proj layers are stored dense (their dequantized weights, with Diff's "
                    "head-norm weight folded in, which a per-row scale cannot hold); listed in the metadata's %s "
                    "and the config's ignore list", path, len(dense), DENSE_KEY)
    return path


def _dividing_sizes(weights) -> str:
    """The group sizes that divide every input width, for a refusal."""
    widths = sorted({w.codes.shape[1] for w in weights})
    common = math.gcd(*widths)
    fits = [str(g) for g in range(2, common + 1) if common % g == 0]
    return (f"--group-size {' or '.join(fits)}, which divide" if fits else "no group size above 1 divides") + \
        f" every width ({', '.join(map(str, widths))}), or with one scale per row"


def _float_hf_into(folder: Path, float_model: LM, tokenizer, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``save_hf``'s files of the float model in ``folder`` (config, tokenizer); returns its HF tensors.

    The sidecar (exact originals for diffquant's way back from a float folder) is dropped: diffquant does not
    read quantized HF folders back.
    """
    scratch = folder / "float"
    save_hf(float_model, scratch, tokenizer=tokenizer, dtype=dtype)
    tensors = load_file(str(scratch / WEIGHTS_FILE))
    for item in scratch.iterdir():
        if item.name not in (WEIGHTS_FILE, SIDECAR_FILE):
            item.rename(folder / item.name)
    shutil.rmtree(scratch)
    return tensors


def _dense_in_hf(cfg, float_model: LM, ints: dict[str, IntWeight]) -> list[str]:
    """Quantized Linears DiffLlama must hold dense: out_proj where a non-trivial head-norm weight is folded in."""
    if cfg.arch != "diff":
        return []
    return [name for name in ints if name.endswith("attn.out_proj") and not bool(
        (float_model.get_submodule(name.rsplit(".", 1)[0]).subln.weight == 1).all())]


def _add_quantization_config(folder: Path, qconfig: dict) -> None:
    config = read_json_file(folder / "config.json")
    config["quantization_config"] = qconfig
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
