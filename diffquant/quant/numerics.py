"""Quantization numerics: integer (2–16 bits) and float formats at a chosen granularity.

Pure tensor functions, no model imports; they run inside every attention forward, so everything is
vectorised (per-group works by a reshape, never a loop over slices) and inputs are never modified.

Integer formats (``s`` = scale, per slice of the granularity, computed on the masked entries):

* symmetric absmax (docs/ARCHITECTURE.md, section 4.2): ``qmax = 2**(bits-1) - 1``, ``s = amax / qmax``,
  ``q = clamp(round(x / s), -qmax, qmax)``, ``x_hat = q * s``; codes in ``[-qmax, qmax]``.
* asymmetric min/max (the range is widened to contain 0, as torch/torchao do, so that 0 is exact and the
  zero point is always a valid code): ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)``,
  ``s = (hi - lo) / (2**bits - 1)``, ``z = clamp(round(-lo / s), 0, 2**bits - 1)``,
  ``q = clamp(round(x / s) + z, 0, 2**bits - 1)``, ``x_hat = (q - z) * s``.

``round`` is ``torch.round`` (half to even). A slice whose scale is 0 (all zero, or with no counted entry)
gets codes 0 (and zero point 0) and dequantizes to exact zeros, never NaN.

Arithmetic runs in float32 (float64 for float64 inputs); half inputs are upcast first and results cast back.
Scales have that compute dtype.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "FLOAT_FORMATS",
    "Granularity",
    "PerAxis",
    "PerGroup",
    "PerTensor",
    "QTensor",
    "as_granularity",
    "code_range",
    "dequantize",
    "fake_quantize",
    "fake_quantize_float",
    "n_groups",
    "quantize_tensor",
    "sqnr",
]


# ----------------------------------------------------------------------------- granularities


@dataclass(frozen=True)
class PerTensor:
    """One scale for the whole tensor."""


@dataclass(frozen=True)
class PerAxis:
    """One scale per index of the kept ``axes``; reduce over all other axes.

    Per-row of a weight [out, in] = ``PerAxis((0,))``; per-token of [B, T, D] = ``PerAxis((0, 1))``;
    per-sequence of [B, ...] = ``PerAxis((0,))``. Negative axes count from the end.
    """

    axes: tuple[int, ...]

    def __post_init__(self) -> None:
        axes = (self.axes,) if isinstance(self.axes, numbers.Integral) else tuple(self.axes)
        if not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in axes):
            raise ValueError(f"PerAxis axes must be integers, got {self.axes!r}")
        object.__setattr__(self, "axes", tuple(int(a) for a in axes))


@dataclass(frozen=True)
class PerGroup:
    """One scale per group of ``group_size`` contiguous elements along the last dim (per row-group).

    A width that ``group_size`` does not divide ends in one shorter (ragged) group, as in GPTQ's reference code
    (its groups are column slices ``W[:, i:i + groupsize]``). Scales (and zero points) have shape
    ``x.shape[:-1] + (ceil(x.shape[-1] / group_size),)``, the usual [rows, n_groups] layout; :func:`dequantize`
    expands them back over the groups.
    """

    group_size: int

    def __post_init__(self) -> None:
        g = self.group_size
        if not isinstance(g, numbers.Integral) or isinstance(g, bool) or g < 1:
            raise ValueError(f"group_size must be a positive integer, got {g!r}")


Granularity = PerTensor | PerAxis | PerGroup


def n_groups(group_size: int | None, width: int) -> int:
    """Scales per row of ``width`` columns: 1 (None: per row), else ``ceil(width / group_size)`` (last one ragged)."""
    return 1 if group_size is None else -(-width // group_size)


def as_granularity(spec: Granularity | str) -> Granularity:
    """Granularity from an instance or a string: "tensor", "row" (= PerAxis((0,))), "group:<g>".

    Here "tensor" is the whole tensor. Activation quantizers at probes name their own granularities
    ("sequence", "head", "token", ...: :data:`diffquant.kinds.ACT_GRANULARITIES`) and map them to these types.
    """
    if isinstance(spec, (PerTensor, PerAxis, PerGroup)):
        return spec
    if isinstance(spec, str):
        if spec == "tensor":
            return PerTensor()
        if spec == "row":
            return PerAxis((0,))
        if spec.startswith("group:") and spec[6:].isdigit():
            return PerGroup(int(spec[6:]))
    raise ValueError(
        f"unknown granularity {spec!r}; use PerTensor/PerAxis/PerGroup or 'tensor', 'row', 'group:<g>'"
    )


# ----------------------------------------------------------------------------- validation helpers


def _check_bits(bits: object) -> int:
    if not isinstance(bits, numbers.Integral) or isinstance(bits, bool) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an integer in 2..16, got {bits!r}")
    return int(bits)


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating-point tensor, got {got}")


def _check_mask(mask: torch.Tensor | None, x: torch.Tensor) -> None:
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    try:
        ok = torch.broadcast_shapes(mask.shape, x.shape) == x.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to x of shape {tuple(x.shape)}"
        )


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # float64 stays float64; everything narrower is computed in float32 (exact upcast, correct rounding).
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def code_range(bits: int, symmetric: bool = True) -> tuple[int, int]:
    """Inclusive integer code range: ``(-qmax, qmax)`` symmetric, ``(0, 2**bits - 1)`` asymmetric."""
    bits = _check_bits(bits)
    if symmetric:
        return -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _code_dtype(bits: int, symmetric: bool) -> torch.dtype:
    # Smallest signed integer type that holds the code range.
    hi = code_range(bits, symmetric)[1]
    return torch.int8 if hi <= 127 else torch.int16 if hi <= 32767 else torch.int32


# ----------------------------------------------------------------------------- working views


def _working_view(
    x: torch.Tensor, gran: Granularity, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """(x in compute dtype, mask, dims to reduce); for PerGroup both are viewed as [..., n_groups, g]."""
    xw = x.to(_compute_dtype(x))
    if isinstance(gran, PerTensor):
        return xw, mask, tuple(range(x.ndim))
    if isinstance(gran, PerAxis):
        return xw, mask, _reduce_dims(gran.axes, x.ndim)
    g = gran.group_size
    if x.ndim == 0:
        raise ValueError(f"group_size {g} needs a last dim to group (got a 0-d tensor)")
    # A ragged last group is padded with zeros that count for nothing: every range contains 0 (absmax >= 0, the
    # asymmetric range is widened to contain 0), so they change no scale; the caller drops them afterwards.
    pad = -x.shape[-1] % g
    grouped = (*x.shape[:-1], (x.shape[-1] + pad) // g, g)
    if mask is not None:
        mask = mask.expand(x.shape)
        mask = (F.pad(mask, (0, pad), value=False) if pad else mask).reshape(grouped)
    return (F.pad(xw, (0, pad)) if pad else xw).reshape(grouped), mask, (x.ndim,)


def _ungrouped(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A grouped working tensor [..., n_groups, g] back to ``shape``, without a ragged group's padding."""
    return t.flatten(-2)[..., :shape[-1]].reshape(shape) if t.ndim > len(shape) else t.reshape(shape)


def _reduce_dims(axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    kept = set()
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} out of range for a {ndim}-d tensor")
        kept.add(a % ndim)
    if len(kept) != len(axes):
        raise ValueError(f"duplicate axes {axes} for a {ndim}-d tensor")
    return tuple(d for d in range(ndim) if d not in kept)


def _amax(xw: torch.Tensor, dims: tuple[int, ...], mask: torch.Tensor | None) -> torch.Tensor:
    a = xw.abs()
    if mask is not None:
        a.masked_fill_(~mask, 0)  # a is our own temporary
    # Empty dims would make amax reduce everything: with nothing to reduce each entry is its own slice.
    return a.amax(dim=dims, keepdim=True) if dims else a


def _minmax(
    xw: torch.Tensor, dims: tuple[int, ...], mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = xw, xw
    if mask is not None:
        lo, hi = xw.masked_fill(~mask, math.inf), xw.masked_fill(~mask, -math.inf)
    if dims:
        lo, hi = lo.amin(dim=dims, keepdim=True), hi.amax(dim=dims, keepdim=True)
    # Widen to contain 0: 0 stays exact and z is a valid code (a fully masked slice gives lo = hi = 0).
    return lo.clamp(max=0), hi.clamp(min=0)


def _divisor(scale: torch.Tensor) -> torch.Tensor:
    # A zero scale divides by inf so finite entries get code 0 instead of 0/0 = NaN.
    return torch.where(scale > 0, scale, math.inf)


# ----------------------------------------------------------------------------- integer quantization


def _qparams(
    xw: torch.Tensor, dims: tuple[int, ...], mask: torch.Tensor | None, bits: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scale and (asymmetric) float zero point, keepdim-shaped over the working view."""
    qmax = code_range(bits, symmetric)[1]
    if symmetric:
        return _amax(xw, dims, mask) / qmax, None
    lo, hi = _minmax(xw, dims, mask)
    scale = (hi - lo) / qmax
    return scale, torch.round(-lo / _divisor(scale)).clamp_(0, qmax)


def _float_codes(
    xw: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int, symmetric: bool
) -> torch.Tensor:
    """Integer-valued codes, still in the compute dtype (a fresh tensor, safe to edit in place)."""
    qmin, qmax = code_range(bits, symmetric)
    q = torch.round(xw / _divisor(scale))
    if zero is not None:
        q.add_(zero)
    return q.clamp_(qmin, qmax)


class QTensor(NamedTuple):
    """Result of :func:`quantize_tensor`; ``dequantize(*qt)`` reconstructs in the input's dtype.

    codes: int8 / int16 / int32 (smallest signed type for the code range), shape of x.
    scale: compute dtype; broadcastable to x (PerGroup: ``[..., n_groups]``, expanded by dequantize).
    zero:  None (symmetric) or integer zero points with the scale's shape and the codes' dtype.
    dtype: the dtype of the quantized input.
    group_size: PerGroup's group size (None otherwise): with a ragged last group the scale's shape alone
        cannot tell it.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    dtype: torch.dtype
    group_size: int | None = None


def quantize_tensor(
    x: torch.Tensor,
    bits: int,
    granularity: Granularity | str = PerTensor(),
    symmetric: bool = True,
    mask: torch.Tensor | None = None,
) -> QTensor:
    """Integer codes of ``x`` (see the module docstring for the formulas).

    ``mask`` (bool, broadcastable to x, True = counts) restricts the entries that set the scale (e.g. the
    causal mask for attention logits); masked-out entries are still quantized with that scale and clamp.
    """
    bits, gran = _check_bits(bits), as_granularity(granularity)
    _check_input(x)
    _check_mask(mask, x)
    xw, mw, dims = _working_view(x, gran, mask)
    scale, zero = _qparams(xw, dims, mw, bits, symmetric)
    cdt = _code_dtype(bits, symmetric)
    codes = _ungrouped(_float_codes(xw, scale, zero, bits, symmetric).to(cdt), x.shape)
    group_size = gran.group_size if isinstance(gran, PerGroup) else None
    if group_size is not None:  # [..., n_groups, 1] -> [..., n_groups]
        scale, zero = scale.squeeze(-1), None if zero is None else zero.squeeze(-1)
    return QTensor(codes, scale, None if zero is None else zero.to(cdt), x.dtype, group_size)


def dequantize(
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """``(codes - zero) * scale`` in the scale's dtype, cast to ``dtype`` (default: the scale's dtype).

    A scale whose last dim is neither 1 nor codes' last dim is a per-group scale ``[..., n_groups]``, groups of
    ``group_size`` columns (the last one ragged), or, without ``group_size``, of ``d / n_groups`` columns.
    """
    cd = scale.dtype
    q = codes.to(cd)
    if codes.ndim > 0 and scale.ndim == codes.ndim and scale.shape[-1] not in (1, codes.shape[-1]):
        n, d = scale.shape[-1], codes.shape[-1]
        if group_size is None:
            if d % n:
                raise ValueError(f"scale's last dim {n} neither broadcasts to nor divides codes' last dim {d}")
            group_size = d // n
        elif n_groups(group_size, d) != n:
            raise ValueError(f"scale's last dim {n} is not the number of groups of {group_size} columns in codes' "
                             f"last dim {d}")
        scale = scale.repeat_interleave(group_size, dim=-1)[..., :d]
        zero = None if zero is None else zero.repeat_interleave(group_size, dim=-1)[..., :d]
    if zero is not None:
        q = q - zero.to(cd)
    return (q * scale).to(dtype or cd)


def fake_quantize(
    x: torch.Tensor,
    bits: int,
    granularity: Granularity | str = PerTensor(),
    symmetric: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantize and dequantize in one pass: a new tensor of x's dtype and shape.

    Bit-identical to ``dequantize(*quantize_tensor(x, ...))`` but skips the integer tensor. No straight-through
    gradient: this is for post-training quantization.
    """
    bits, gran = _check_bits(bits), as_granularity(granularity)
    _check_input(x)
    _check_mask(mask, x)
    xw, mw, dims = _working_view(x, gran, mask)
    scale, zero = _qparams(xw, dims, mw, bits, symmetric)
    q = _float_codes(xw, scale, zero, bits, symmetric)
    if zero is not None:
        q.sub_(zero)
    return _ungrouped(q.mul_(scale), x.shape).to(x.dtype)


# ----------------------------------------------------------------------------- float formats

# name -> (storage dtype, scaled): scaled formats map each slice's amax onto the format's largest finite value.
FLOAT_FORMATS: dict[str, tuple[torch.dtype, bool]] = {
    "fp16": (torch.float16, False),
    "bf16": (torch.bfloat16, False),
    "fp8_e4m3": (torch.float8_e4m3fn, True),
    "fp8_e5m2": (torch.float8_e5m2, True),
}


def fake_quantize_float(
    x: torch.Tensor,
    fmt: str,
    granularity: Granularity | str = PerTensor(),
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round ``x`` through a float format; a new tensor of x's dtype and shape.

    "fp16" / "bf16": a plain cast and back (granularity and mask unused; fp16 overflows to inf past 65504).
    "fp8_e4m3" / "fp8_e5m2": ``s = amax / fmax`` per slice (fmax = 448 / 57344, the largest finite value),
    ``x_hat = cast_fp8(clamp(x / s, -fmax, fmax)) * s`` in float32 (float64 for float64 input); the clamp
    keeps masked-out entries beyond amax finite. A zero scale gives zeros.
    """
    if fmt not in FLOAT_FORMATS:
        raise ValueError(f"unknown float format {fmt!r}; choose from {', '.join(FLOAT_FORMATS)}")
    _check_input(x)
    _check_mask(mask, x)
    fdt, scaled = FLOAT_FORMATS[fmt]
    if not scaled:
        return x.to(fdt).to(x.dtype, copy=True)  # copy: never hand back x itself
    xw, mw, dims = _working_view(x, as_granularity(granularity), mask)
    fmax = torch.finfo(fdt).max
    scale = _amax(xw, dims, mw) / fmax
    y = (xw / _divisor(scale)).clamp_(-fmax, fmax).to(fdt).to(xw.dtype)
    return _ungrouped(y.mul_(scale), x.shape).to(x.dtype)


# ----------------------------------------------------------------------------- error metric


def sqnr(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB, ``20·log10(‖x‖ / ‖x − x_hat‖)``, computed in float64.

    ``inf`` when x_hat equals x; ``-inf`` when x is zero but x_hat is not.
    """
    if x.shape != x_hat.shape:
        raise ValueError(f"sqnr needs equal shapes, got {tuple(x.shape)} and {tuple(x_hat.shape)}")
    xd = x.detach().to(torch.float64)
    noise = torch.linalg.vector_norm(xd - x_hat.detach().to(torch.float64)).item()
    signal = torch.linalg.vector_norm(xd).item()
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 20.0 * math.log10(signal / noise)
