"""Dynamic activation quantizers: at probes (attention logits, probabilities, Q/K, hidden states) and at the
inputs of Linear layers (per-token W8A8 style).

They are installed by *module swap*, not hooks: a ``QuantProbe`` replaces a ``Probe`` (it is still a Probe of the
same kind, so observers attached later see the quantized values) and an ``InputQuantLinear`` replaces an
``nn.Linear`` keeping the very same weight Parameters (state-dict keys unchanged). The quantizers therefore live
exactly as long as the quantized model, survive ``copy.deepcopy`` and show in ``print(model)``; nothing needs to
be removed, and the float original (``quantize`` works on a copy) is never touched.

Scales are computed per forward over the entries that count: for attention maps, the causal mask (with the
query offset of a chunked forward), so masked logits never set the scale; inside
:func:`diffquant.probes.real_lengths` the padded positions of a right-padded batch never set it either. Every
scale is at least per sequence, so a sequence gets the same result alone or padded in a batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffquant.kinds import ATTENTION_KINDS, MAP_KINDS, canonical_granularity
from diffquant.probes import Probe, padding_mask
from diffquant.quant.config import (
    HEAD_GRANULARITIES,
    PER_SEQUENCE_GRANULARITIES,
    SEQUENCE,
    ActQuant,
)
from diffquant.quant.numerics import PerAxis, fake_quantize

__all__ = ["InputQuantLinear", "QuantProbe", "act_granularity", "quantize_activation"]

def act_granularity(granularity: str, ndim: int, kind: str | None = None) -> PerAxis:
    """The explicit reduction of a probe-level granularity for a tensor of ``ndim`` dims (dim 0 = batch).

    "sequence" keeps dim 0; "row"/"token" keep every dim but the last; "head" keeps (batch, head):
    for Diff attention maps [B, H, 2, T, S] both maps of a head share the scale; "head_map" keeps the map index
    too (one scale per map, like the matched Transformer's heads; the same as "head" for every other tensor).
    """
    if ndim < 2:
        raise ValueError(f"activation quantization needs a batch dim and a feature dim, got a {ndim}-d tensor")
    granularity = canonical_granularity(granularity)
    if granularity == SEQUENCE:
        return PerAxis((0,))
    if granularity in ("row", "token"):
        return PerAxis(tuple(range(ndim - 1)))
    if granularity in HEAD_GRANULARITIES:
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"granularity {granularity!r} applies to attention probes only, "
                             f"not to {kind or 'this tensor'}")
        diff_maps = kind in MAP_KINDS and ndim == 5
        return PerAxis((0, 1, 2) if diff_maps and granularity == "head_map" else (0, 1))
    raise ValueError(f"unknown activation granularity {granularity!r}")


def quantize_activation(
    x: torch.Tensor, act: ActQuant, kind: str | None = None, mask: torch.Tensor | None = None, q_offset: int = 0
) -> torch.Tensor:
    """Fake-quantize ``x`` dynamically (a new tensor; ``x`` itself when ``act`` is the 16-bit no-op).

    Scales come from the entries ``mask`` keeps (None: all) that are real tokens (:func:`padding_mask`; dim -2
    holds positions from ``q_offset``); padded entries are quantized with their row's scale all the same.
    """
    if act.is_noop:
        return x
    padded = padding_mask(x, q_offset)
    if padded is not None:
        mask = padded if mask is None else mask & padded
    return fake_quantize(x, act.bits, act_granularity(act.granularity, x.ndim, kind), act.symmetric, mask)


class QuantProbe(Probe):
    """A Probe that hands on the dynamically fake-quantized tensor instead of the tensor itself."""

    def __init__(self, kind: str, act: ActQuant):
        super().__init__(kind)
        if not isinstance(act, ActQuant):
            raise ValueError(f"QuantProbe needs an ActQuant, got {type(act).__name__}")
        act_granularity(act.granularity, 5, kind)  # refuse head granularities on other kinds now, not mid-forward
        self.act = act

    @classmethod
    def from_probe(cls, probe: Probe, act: ActQuant) -> "QuantProbe":
        quant = cls(probe.kind, act)
        quant.window = probe.window
        return quant

    def forward(self, x: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
        if q_offset and self.causal and self.act.granularity in PER_SEQUENCE_GRANULARITIES:
            # With query chunks a per-sequence scale would only see one chunk: results would depend on chunking.
            raise RuntimeError(
                f"{self.kind} quantization with granularity {self.act.granularity!r} needs unchunked eager "
                "attention (set_attn_impl('eager', chunk=None)) or granularity 'row'")
        return quantize_activation(x, self.act, self.kind, self.causal_mask(x, q_offset), q_offset)

    def scheme(self) -> dict:
        return {"type": "QuantProbe", "kind": self.kind, "act": self.act.to_dict()}

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, act={self.act}"


class InputQuantLinear(nn.Linear):
    """An ``nn.Linear`` (float weights, the same Parameters as the original) whose input is quantized."""

    def __init__(self, in_features: int, out_features: int, act: ActQuant, bias: bool = True,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.act = act

    @classmethod
    def from_linear(cls, linear: nn.Linear, act: ActQuant) -> "InputQuantLinear":
        new = cls(linear.in_features, linear.out_features, act, bias=linear.bias is not None, device="meta")
        new.weight = linear.weight  # shared, not copied: the keys and values of the state dict stay the same
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(quantize_activation(x, self.act), self.weight, self.bias)

    def scheme(self) -> dict:
        return {"type": "InputQuantLinear", "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None, "act": self.act.to_dict()}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, act={self.act}"
