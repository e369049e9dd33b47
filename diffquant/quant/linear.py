"""Quantized weight modules (gpt-fast style): integer codes + scales (+ zero points) as buffers.

Storage, the same in memory and on disk (the state dict *is* the packed checkpoint):

* ``qweight`` (uint8): the codes offset to be unsigned, ``u = code - qmin`` (qmin = -(2**(bits-1)-1) symmetric,
  0 asymmetric). Codes of ≤ 4 bits are packed two per byte (low nibble = even input column, high nibble = odd;
  an odd width is padded with one zero nibble); 5–8-bit codes take one byte each.
* ``scale`` (float): ``[out, n_groups]``, n_groups = 1 per output channel or ``ceil(in / group_size)`` (groups
  of ``group_size`` contiguous input columns, the last one shorter where the size does not divide the width).
* ``zero`` (uint8, asymmetric only): integer zero points with the scale's shape.

Weight = ``(code - zero) * scale``, computed once and cached (the cache follows device and dtype changes and is
dropped when a state dict is loaded); forward is then a plain ``F.linear`` / ``F.embedding``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffquant.quant.act import quantize_activation
from diffquant.quant.config import ActQuant
from diffquant.quant.numerics import code_range, dequantize, n_groups

__all__ = ["QuantEmbedding", "QuantLinear", "pack_codes", "storage_kind", "unpack_codes"]


def storage_kind(bits: int) -> str:
    """How codes of ``bits`` bits are stored: "uint4x2" (two per byte) or "uint8" (one per byte)."""
    return "uint4x2" if bits <= 4 else "uint8"


def pack_codes(codes: torch.Tensor, bits: int, symmetric: bool) -> torch.Tensor:
    """Integer codes (any int dtype, last dim = input columns) -> uint8 storage as described above."""
    qmin, qmax = code_range(bits, symmetric)
    if codes.numel() and (int(codes.min()) < qmin or int(codes.max()) > qmax):
        raise ValueError(f"codes outside the {bits}-bit range {qmin}..{qmax}")
    u = (codes.to(torch.int16) - qmin).to(torch.uint8)
    if bits > 4:
        return u.contiguous()
    if u.shape[-1] % 2:
        u = F.pad(u, (0, 1))  # one zero nibble; unpack_codes drops it again
    return (u[..., 0::2] | (u[..., 1::2] << 4)).contiguous()


def unpack_codes(qweight: torch.Tensor, bits: int, symmetric: bool, width: int) -> torch.Tensor:
    """uint8 storage -> signed int16 codes with ``width`` columns (inverse of :func:`pack_codes`)."""
    qmin = code_range(bits, symmetric)[0]
    u = qweight
    if bits <= 4:
        u = torch.stack((u & 0x0F, u >> 4), dim=-1).flatten(-2)[..., :width]  # (rows, 2·cols) -> (rows, width)
    return u.to(torch.int16) + qmin


class _PackedWeight(nn.Module):
    """Buffers and cached dequantization shared by QuantLinear and QuantEmbedding (rows x cols codes)."""

    def _init_buffers(self, rows: int, cols: int, bits: int, group_size: int | None, symmetric: bool) -> None:
        self.bits, self.group_size, self.symmetric, self.cols = bits, group_size, symmetric, cols
        groups = n_groups(group_size, cols)
        packed_cols = (cols + 1) // 2 if bits <= 4 else cols
        self.register_buffer("qweight", torch.zeros(rows, packed_cols, dtype=torch.uint8))
        self.register_buffer("scale", torch.zeros(rows, groups))
        self.register_buffer("zero", None if symmetric else torch.zeros(rows, groups, dtype=torch.uint8))
        self._cache: torch.Tensor | None = None
        self._cache_key: tuple | None = None

    def set_codes(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> None:
        """Store codes [rows, cols], scale and zero ([rows, n_groups] or [rows, 1]) from a quantizer."""
        if tuple(codes.shape) != (self.qweight.shape[0], self.cols):
            raise ValueError(f"codes of shape {tuple(codes.shape)} do not fit {self.qweight.shape[0]}x{self.cols}")
        if (zero is None) != self.symmetric:
            raise ValueError("zero points go with asymmetric quantization only")
        with torch.no_grad():
            self.qweight.copy_(pack_codes(codes, self.bits, self.symmetric))
            self.scale = scale.detach().reshape(self.scale.shape).clone()  # keeps the quantizer's float dtype
            if zero is not None:
                self.zero.copy_(zero.reshape(self.zero.shape).to(torch.uint8))
        self.clear_cache()

    def codes(self) -> torch.Tensor:
        """Signed integer codes [rows, cols] (int16)."""
        return unpack_codes(self.qweight, self.bits, self.symmetric, self.cols)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``(code - zero) * scale`` in the scale's dtype, cast to ``dtype``; cached."""
        key = (self.qweight.device, self.scale.dtype, dtype)
        if self._cache is None or self._cache_key != key:
            with torch.no_grad():
                self._cache = dequantize(self.codes(), self.scale, self.zero, dtype or self.scale.dtype,
                                         self.group_size)
            self._cache_key = key
        return self._cache

    def clear_cache(self) -> None:
        self._cache, self._cache_key = None, None

    def _load_from_state_dict(self, *args, **kwargs):  # new buffer values: the cached weight is stale
        self.clear_cache()
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, recurse=True):  # .to() / .half(): new buffer values, so the cached weight is stale
        self.clear_cache()
        return super()._apply(fn, recurse)

    def scheme(self) -> dict:
        """What quant.json records for this module."""
        return {"bits": self.bits, "group_size": self.group_size, "symmetric": self.symmetric,
                "storage": storage_kind(self.bits)}


class QuantLinear(_PackedWeight):
    """``y = x_q @ W_hatᵀ + b`` with W_hat dequantized from packed codes; x_q = x unless ``act`` is set."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int | None = None,
                 symmetric: bool = True, bias: bool = False, act: ActQuant | None = None):
        super().__init__()
        self.in_features, self.out_features, self.act = in_features, out_features, act
        self._init_buffers(out_features, in_features, bits, group_size, symmetric)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_codes(cls, linear: nn.Linear, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                   bits: int, group_size: int | None, act: ActQuant | None = None) -> "QuantLinear":
        new = cls(linear.in_features, linear.out_features, bits, group_size, symmetric=zero is None,
                  bias=linear.bias is not None, act=act)
        new.set_codes(codes, scale, zero)
        if linear.bias is not None:
            new.bias = nn.Parameter(linear.bias.detach().clone())
        return new.to(linear.weight.device)

    @classmethod
    def from_float(cls, linear: nn.Linear, bits: int, group_size: int | None = None, symmetric: bool = True,
                   act: ActQuant | None = None) -> "QuantLinear":
        """Round-to-nearest quantization of ``linear``'s weight (the float module is left untouched)."""
        from diffquant.quant.rtn import rtn_codes  # rtn builds on this module's storage rules

        codes, scale, zero = rtn_codes(linear.weight, bits, group_size, symmetric)
        return cls.from_codes(linear, codes, scale, zero, bits, group_size, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is not None:
            x = quantize_activation(x, self.act)
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def scheme(self) -> dict:
        return {"type": "QuantLinear", "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None, **super().scheme(),
                "act": None if self.act is None else self.act.to_dict()}

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, symmetric={self.symmetric}, act={self.act}")


class QuantEmbedding(_PackedWeight):
    """Token embedding looked up in the dequantized table (per-row scales, optionally per group)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bits: int, group_size: int | None = None,
                 symmetric: bool = True):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self._init_buffers(num_embeddings, embedding_dim, bits, group_size, symmetric)

    @classmethod
    def from_float(cls, embedding: nn.Embedding, bits: int, group_size: int | None = None,
                   symmetric: bool = True) -> "QuantEmbedding":
        from diffquant.quant.rtn import rtn_codes

        new = cls(embedding.num_embeddings, embedding.embedding_dim, bits, group_size, symmetric)
        new.set_codes(*rtn_codes(embedding.weight, bits, group_size, symmetric))
        return new.to(embedding.weight.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.dequantized_weight())

    def scheme(self) -> dict:
        return {"type": "QuantEmbedding", "num_embeddings": self.num_embeddings,
                "embedding_dim": self.embedding_dim, **super().scheme()}

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}, group_size={self.group_size}, "
                f"symmetric={self.symmetric}")
