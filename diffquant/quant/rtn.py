"""Round-to-nearest weight quantization, per output channel or per group of input columns."""

from __future__ import annotations

import torch

from diffquant.quant.numerics import PerAxis, PerGroup, quantize

__all__ = ["rtn_codes", "weight_granularity"]


def weight_granularity(group_size: int | None, in_features: int) -> PerAxis | PerGroup:
    """Per output channel (rows of [out, in]) or per group of ``group_size`` contiguous input columns."""
    if group_size is None:
        return PerAxis((0,))
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide the input width {in_features}")
    return PerGroup(group_size)


def rtn_codes(
    weight: torch.Tensor, bits: int, group_size: int | None = None, symmetric: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes [out, in], scale [out, n_groups], zero [out, n_groups] or None) of a float weight [out, in]."""
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-d [out, in], got shape {tuple(weight.shape)}")
    codes, scale, zero, _ = quantize(weight.detach(), bits, weight_granularity(group_size, weight.shape[1]),
                                     symmetric)
    return codes, scale.reshape(weight.shape[0], -1), None if zero is None else zero.reshape(weight.shape[0], -1)
