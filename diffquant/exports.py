"""What every quantized export needs from a quantized diffquant model: its integer weights, exactly as stored.

A packed checkpoint holds, per quantized Linear, codes + scales (+ zero points) with ``W = (code - zero) * scale``.
Runtimes store ``W = q * d`` with a signed integer ``q`` (plus, in some formats, a zero point), so an export
writes our codes and scales as they are, never re-rounding the float weights. Only weight-only schemes of a
method that lists the format among its exports go out (RTN / GPTQ ``QuantLinear``): a runtime that reads the
weights would not apply our dynamic activation or attention-logit quantizers, bitsandbytes layers have formats
of their own, and Hadamard-rotated codes describe ``W·H``, not ``W``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from .checkpoint import CheckpointError
from .model import LM, build_model
from .quant.act import QuantProbe
from .quant.api import iter_quantized
from .quant.linear import QuantEmbedding, QuantLinear
from .quant.registry import method_for_module, refuse_export

log = logging.getLogger(__name__)

__all__ = ["IntWeight", "block_int_weights", "check_weight_only", "dequantized_copy", "exactly_in"]


@dataclass(frozen=True)
class IntWeight:
    """One quantized Linear as integers: ``W[r, c] = (codes[r, c] - zero[r, g]) * scale[r, g]``, g = c // group
    (the last group of a row is shorter when the group size does not divide the width)."""

    codes: torch.Tensor  # int16 [out, in]: signed (symmetric) or 0..2**bits-1 (asymmetric / "full" grid)
    scale: torch.Tensor  # float [out, n_groups] in its stored dtype
    zero: torch.Tensor | None  # int16 [out, n_groups] or None (symmetric)
    bits: int
    group_size: int | None  # None = one scale per output row

    @property
    def group(self) -> int:
        return self.group_size or self.codes.shape[1]

    @property
    def ragged(self) -> bool:
        """Whether the last group of each row is shorter than the others (the size does not divide the width)."""
        return self.codes.shape[1] % self.group != 0

    def signed(self) -> torch.Tensor:
        """``code - zero`` per weight (int16): the integer that multiplies the scale."""
        if self.zero is None:
            return self.codes
        return self.codes - self.zero.repeat_interleave(self.group, dim=1)[:, :self.codes.shape[1]]

    def centered(self) -> bool:
        """Symmetric around zero: no zero point, or the "full" grid's constant 2**(bits-1)."""
        return self.zero is None or self.constant_zero() == 1 << (self.bits - 1)

    def constant_zero(self) -> int | None:
        """The zero point when it is the same everywhere (0 for symmetric, 2**(bits-1) for the "full" grid)."""
        if self.zero is None:
            return 0
        first = int(self.zero.flatten()[0]) if self.zero.numel() else 0
        return first if bool((self.zero == first).all()) else None


def check_weight_only(model: nn.Module, fmt: str) -> None:
    """Refuse what ``fmt`` cannot carry: activation / logit quantizers, and weights of a method that does not
    list ``fmt`` among its export formats (:mod:`diffquant.quant.registry`)."""
    recorded = getattr(getattr(model, "quant_config", None), "weights", None)
    if recorded is not None and (refusal := refuse_export(recorded.handler, fmt, "the model's weight method")):
        raise CheckpointError(refusal)
    for name, module in iter_quantized(model):
        if isinstance(module, QuantProbe) or getattr(module, "act", None) is not None:
            raise CheckpointError(f"{fmt} export carries quantized weights only; {name} also quantizes activations "
                                  "or attention logits at run time (quantize with --weights only)")
        method = method_for_module(module)
        if method is None:
            raise CheckpointError(f"{fmt} export covers quantized weights; {name} is a {type(module).__name__}")
        refusal = refuse_export(method, fmt, name)
        if refusal:
            raise CheckpointError(refusal)


def block_int_weights(model: LM) -> dict[str, IntWeight]:
    """Our name (``layers.0.attn.q_proj``) -> IntWeight of every quantized Linear inside the blocks."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear) and name.startswith("layers."):
            zero = None if module.zero is None else module.zero.to(torch.int16)
            out[name] = IntWeight(module.codes(), module.scale.detach(), zero, module.bits, module.group_size)
    return out


def dequantized_copy(model: LM) -> LM:
    """A float LM (eval mode, float32) whose weights are the quantized model's dequantized weights, exactly."""
    state = {}
    packed = {n: m for n, m in model.named_modules() if isinstance(m, (QuantLinear, QuantEmbedding))}
    for key, value in model.state_dict().items():
        owner, _, attr = key.rpartition(".")
        if owner in packed:
            if attr == "qweight":
                state[f"{owner}.weight"] = packed[owner].dequantized_weight(torch.float32)
            continue  # scale / zero live in the dequantized weight
        state[key] = value.float()
    float_model = build_model(model.config)
    missing, unexpected = float_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "head.weight" and model.config.tie_embeddings)]
    if missing or unexpected:  # a naming bug, never user input
        raise RuntimeError(f"dequantized state mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return float_model.eval()


def exactly_in(scale: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every scale survives a cast to ``dtype`` unchanged (finite, no rounding)."""
    cast = scale.to(dtype)
    return bool(torch.isfinite(cast).all()) and torch.equal(cast.to(scale.dtype), scale)
