"""One entry point: ``quantize_(model, config, calib, filter_fn)`` in place, ``quantize(...)`` on a copy.

Modules are chosen by type and name, never by importing the model code, so the same calls work on diffquant
models and on Hugging Face models:

* weights and Linear inputs: the ``nn.Linear`` modules (and transformers' ``Conv1D``, GPT-2's Linear that stores
  its weight transposed, [in, out]: each chosen one is first swapped for the equal ``nn.Linear`` with weight
  ``Wᵀ``, so scales are per output channel as for any Linear) that ``filter_fn(name, module)`` accepts; by default
  those inside the blocks (a qualified name with a numeric part, e.g. ``layers.3.attn.q_proj``), so the
  embedding and the output head stay float unless ``WeightQuant(embeddings=True)`` (or a filter) asks;
* probes (logits, probs, qk, hidden): every ``Probe`` of the configured kinds (diffquant models, and HF models
  through :class:`~diffquant.hf_probes.HFProbed`: hidden states, and attention logits where it probes them).

Everything is installed by module swap (see ``act.py`` / ``linear.py``); the config is recorded on the model
as ``model.quant_config`` and every swapped module knows its own scheme, which ``diffquant/checkpoint/packed.py`` saves.
"""

from __future__ import annotations

import copy
import logging
from typing import Callable, Iterable

import torch
from torch import nn

from diffquant.attention import switchable
from diffquant.kinds import ATTENTION_KINDS
from diffquant.probes import probes
from diffquant.quant.act import InputQuantLinear, QuantProbe
from diffquant.quant.config import PER_SEQUENCE_GRANULARITIES, QuantConfig, WeightQuant
from diffquant.quant.linear import QuantEmbedding, QuantLinear, _PackedWeight

log = logging.getLogger(__name__)

__all__ = ["conv1d_to_linear", "default_filter", "is_conv1d", "is_quantized", "iter_quantized", "quantize",
           "quantize_", "tie_packed"]

FilterFn = Callable[[str, nn.Module], bool]
CALIB_BATCH = 8  # rows per forward when calib is one [N, T] tensor


def _inside_block(name: str) -> bool:
    return any(part.isdigit() for part in name.split("."))


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2 family): ``y = x @ W + b`` with W [in, out]; found by name, not import."""
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers")


def _linear_like(module: nn.Module) -> bool:
    return type(module) is nn.Linear or is_conv1d(module)


def default_filter(name: str, module: nn.Module) -> bool:
    """The Linear (or Conv1D) layers inside the blocks (their names have a numeric part: ``layers.0.mlp.up_proj``)."""
    return _linear_like(module) and _inside_block(name)


def conv1d_to_linear(conv: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` computing what ``conv`` (a transformers Conv1D, weight [in, out]) computes."""
    n_in, n_out = conv.weight.shape
    linear = nn.Linear(n_in, n_out, bias=conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear


def _linearize(model: nn.Module, names: list[str]) -> None:
    for name in names:
        module = model.get_submodule(name)
        if is_conv1d(module):
            model.set_submodule(name, conv1d_to_linear(module))


def is_quantized(model: nn.Module) -> bool:
    return any(True for _ in iter_quantized(model))


def quantize(model: nn.Module, config: QuantConfig, calib=None, filter_fn: FilterFn | None = None) -> nn.Module:
    """A quantized deep copy of ``model``; ``model`` itself is left untouched."""
    return quantize_(copy.deepcopy(model), config, calib, filter_fn)


def quantize_(model: nn.Module, config: QuantConfig, calib=None, filter_fn: FilterFn | None = None) -> nn.Module:
    """Quantize ``model`` in place as ``config`` says and return it.

    calib: token ids for a method that needs calibration (GPTQ): one LongTensor [N, T] (run in batches of 8)
        or an iterable of [B, T] batches.
    filter_fn(name, module) -> bool: which ``nn.Linear`` (and, with ``embeddings``, ``nn.Embedding``) modules
        get weight and input quantization; default :func:`default_filter` (+ embeddings and head if asked).
    """
    if not isinstance(config, QuantConfig):
        raise ValueError(f"config must be a QuantConfig, got {type(config).__name__}")
    if is_quantized(model):
        raise ValueError("the model is already quantized; quantize the float model instead")
    wq = config.weights
    linears, embeddings = _select(model, wq, filter_fn)
    batches = _calib_batches(calib)
    _check_before_changes(model, config, linears, embeddings, batches)
    if config.needs_eager:
        _ensure_eager(model)
    if wq is not None or (config.activations is not None and not config.activations.is_noop):
        _linearize(model, linears)
    if wq is not None:
        _quantize_weights(model, wq, linears, embeddings, batches)
    if config.activations is not None and not config.activations.is_noop:
        _quantize_linear_inputs(model, linears, config.activations)
    _install_probe_quantizers(model, config)
    model.quant_config = config
    return model


# ----------------------------------------------------------------------------- selection and checks


def _select(model: nn.Module, wq: WeightQuant | None, filter_fn: FilterFn | None) -> tuple[list[str], list[str]]:
    """Names of the Linear and Embedding modules to quantize, in module order."""
    want_embeddings = wq is not None and wq.embeddings

    def chosen(name: str, module: nn.Module) -> bool:
        if filter_fn is not None:
            return bool(filter_fn(name, module))
        return default_filter(name, module) or (want_embeddings and not _inside_block(name))

    linears = [n for n, m in model.named_modules() if _linear_like(m) and chosen(n, m)]
    embeddings = [n for n, m in model.named_modules()
                  if want_embeddings and type(m) is nn.Embedding and chosen(n, m)]
    return linears, embeddings


def _calib_batches(calib) -> list[torch.Tensor]:
    if calib is None:
        return []
    if isinstance(calib, torch.Tensor):
        calib = list(calib.split(CALIB_BATCH)) if calib.ndim == 2 else [calib]
    batches = list(calib)
    for b in batches:
        if not isinstance(b, torch.Tensor) or b.ndim != 2 or b.dtype not in (torch.int64, torch.int32):
            got = tuple(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__
            raise ValueError(f"calib must hold integer token-id tensors [B, T], got {got}")
    return batches


def _check_before_changes(model, config: QuantConfig, linears, embeddings, batches) -> None:
    """Every refusal happens here, before the model is touched, so an error never leaves it half quantized."""
    wq = config.weights
    if wq is not None:
        if not linears and not embeddings:
            raise ValueError("no nn.Linear module matches the filter: nothing to quantize")
        wq.handler.check_model(wq, linears, embeddings, batches)
    if config.activations is not None and not linears:
        raise ValueError("no nn.Linear module matches the filter: no inputs to quantize")
    targets = config.probe_targets()
    found = {p.kind for p in probes(model).values()}
    missing = sorted(set(targets) - found)
    if missing:
        raise ValueError(f"the model has no {', '.join(missing)} probes (diffquant models have every kind; "
                         "HFProbed hidden and, where probed, attn_logits)")
    chunked = any(m.chunk for m in switchable(model))
    coarse = any(a.granularity in PER_SEQUENCE_GRANULARITIES for k, a in targets.items() if k in ATTENTION_KINDS)
    if chunked and coarse:
        raise ValueError("per-tensor/per-head attention quantization needs unchunked eager attention "
                         "(set_attn_impl('eager', chunk=None)) or granularity 'row'")


def _ensure_eager(model: nn.Module) -> None:
    """Attention probes fire on the eager path only: switch a fused-attention model to eager."""
    impl = getattr(getattr(model, "config", None), "attn_impl", "eager")
    if impl != "eager":
        if not hasattr(model, "set_attn_impl"):
            raise ValueError(f"attention quantization needs eager attention; the model uses {impl!r}")
        model.set_attn_impl("eager")
        log.info("switched attention from %s to eager: quantized logits exist only there", impl)


# ----------------------------------------------------------------------------- weights


def _quantize_weights(model, wq: WeightQuant, linears: list[str], embeddings: list[str], batches) -> None:
    tied = _tied_pairs(model, linears, embeddings)
    for name in embeddings:
        emb = model.get_submodule(name)
        model.set_submodule(name, QuantEmbedding.from_float(emb, wq.bits, wq.group_size, wq.symmetric))
    wq.handler.quantize_(model, [n for n in linears if n not in tied], wq, batches)
    for lin_name, emb_name in tied.items():
        head = model.get_submodule(lin_name)
        qhead = QuantLinear(head.in_features, head.out_features, wq.bits, wq.group_size, wq.symmetric,
                            bias=head.bias is not None).to(head.weight.device)
        if head.bias is not None:
            qhead.bias = nn.Parameter(head.bias.detach().clone())
        tie_packed(model.get_submodule(emb_name), qhead)
        model.set_submodule(lin_name, qhead)
        log.info("%s shares the quantized codes of the tied embedding %s", lin_name, emb_name)


def _tied_pairs(model, linears: list[str], embeddings: list[str]) -> dict[str, str]:
    """Linear name -> Embedding name for selected pairs that share one weight (tied head and embedding)."""
    by_weight = {id(model.get_submodule(e).weight): e for e in embeddings}
    return {n: by_weight[id(model.get_submodule(n).weight)] for n in linears
            if id(model.get_submodule(n).weight) in by_weight}


def tie_packed(source: _PackedWeight, target: _PackedWeight) -> None:
    """Make ``target`` use ``source``'s code, scale and zero buffers (the same tensors)."""
    target.qweight, target.scale, target.zero = source.qweight, source.scale, source.zero
    target.clear_cache()


# ----------------------------------------------------------------------------- activations and probes


def _quantize_linear_inputs(model, linears: list[str], act) -> None:
    for name in linears:
        module = model.get_submodule(name)
        if isinstance(module, QuantLinear):
            module.act = act
            module.clear_cache()
        elif type(module) is nn.Linear:
            model.set_submodule(name, InputQuantLinear.from_linear(module, act))


def _install_probe_quantizers(model, config: QuantConfig) -> None:
    targets = config.probe_targets()
    chosen = {n: p for n, p in probes(model).items() if p.kind in targets}
    for name, probe in chosen.items():
        model.set_submodule(name, QuantProbe.from_probe(probe, targets[probe.kind]))
    if chosen:
        log.info("quantizing %d probes (%s)", len(chosen), ", ".join(sorted(targets)))


def iter_quantized(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """(name, module) of every module the quantizer installed."""
    for name, m in model.named_modules():
        if isinstance(m, (QuantProbe, _PackedWeight, InputQuantLinear)) or _is_bnb_module(m):
            yield name, m


def _is_bnb_module(module: nn.Module) -> bool:  # without importing bitsandbytes
    return type(module).__module__.startswith("bitsandbytes")
