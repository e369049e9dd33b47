"""Hadamard-rotated RTN (QuaRot-style incoherence processing of the weights), added through the registry alone.

A Linear computes ``y = x Wᵀ + b``. With an orthonormal ``H`` (``H Hᵀ = I``), ``x Wᵀ = (x H)(W H)ᵀ``: the codes
are RTN's of the rotated weight ``W' = W H``, and the layer rotates its input by the same ``H`` before the
matmul, so unquantized it computes exactly the original function. The rotation spreads an outlier input column
over all columns of its block, so per-channel scales waste fewer levels on it.

``H = diag(s) · blockdiag(Hₙ/√n, …)`` with ``s`` random signs (±1, seeded by the layer's name, stored as the
``signs`` buffer so loading never re-draws them) and ``Hₙ`` the Sylvester Hadamard matrix of size ``n``, the
largest power of two dividing the input width (the whole width when it is a power of two). A Linear input
quantizer (``activations``) sees the rotated input, as in QuaRot.

The codes describe ``W H``, not ``W``: runtimes that read plain codes (GGUF, compressed-tensors, a dequantized HF
folder) would compute a different function, so this method exports to diffquant's packed checkpoint only.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F

from diffquant.dispatch import place_like, resident
from diffquant.quant.act import quantize_activation
from diffquant.quant.linear import QuantLinear
from diffquant.quant.methods.rtn import act_of
from diffquant.quant.registry import WeightMethod, register
from diffquant.quant.rtn import rtn_codes

__all__ = ["HadamardQuantLinear", "HadamardRTN", "hadamard_block", "random_signs", "sylvester"]


def hadamard_block(width: int) -> int:
    """The largest power of two dividing ``width``: the size of the Hadamard blocks."""
    return width & -width


def sylvester(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix ``Hₙ/√n`` (n a power of two)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)  # (2m, 2m)
    return (h / n**0.5).to(dtype)


def random_signs(width: int, seed: int) -> torch.Tensor:
    """±1 (int8) per input column, reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (width,), generator=gen, dtype=torch.int8) * 2 - 1).to(torch.int8)


def layer_seed(name: str) -> int:
    """A stable seed per layer name (crc32; Python's hash() is salted per process)."""
    return zlib.crc32(name.encode())


class HadamardQuantLinear(QuantLinear):
    """``y = Q(W H) · (x H)ᵀ + b``: RTN codes of the rotated weight, the input rotated by the same ``H``."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int | None = None,
                 symmetric: bool = True, bias: bool = False, act=None, seed: int = 0):
        super().__init__(in_features, out_features, bits, group_size, symmetric, bias, act)
        self.block, self.seed = hadamard_block(in_features), seed
        self.register_buffer("signs", random_signs(in_features, seed))

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """``x H`` over the last dimension."""
        h = sylvester(self.block, x.dtype).to(x.device)
        y = x * self.signs.to(x.dtype)
        return (y.unflatten(-1, (-1, self.block)) @ h).flatten(-2)  # (..., in/n, n) @ (n, n) -> (..., in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.rotate(x)
        if self.act is not None:
            x = quantize_activation(x, self.act)
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def scheme(self) -> dict:
        return {**super().scheme(), "type": "HadamardQuantLinear", "rotation": "hadamard", "block": self.block,
                "seed": self.seed}


class HadamardRTN(WeightMethod):
    name = "hadamard-rtn"
    module_types = ("HadamardQuantLinear",)
    exports = frozenset()  # the codes are of W·H: only diffquant's packed checkpoint keeps the rotation

    def check(self, wq) -> None:
        if wq.bits is None:
            raise ValueError(f"WeightQuant(method={self.name!r}) needs bits (2..8)")

    def quantize_(self, model, names: list[str], wq, batches: list) -> None:
        for name in names:
            linear = model.get_submodule(name)
            with resident(linear):
                new = HadamardQuantLinear(linear.in_features, linear.out_features, wq.bits, wq.group_size,
                                          wq.symmetric, linear.bias is not None, seed=layer_seed(name))
                weight = linear.weight.detach()
                rotated = new.to(weight.device).rotate(weight.to(torch.float64)).to(weight.dtype)  # W H
                new.set_codes(*rtn_codes(rotated, wq.bits, wq.group_size, wq.symmetric, wq.grid))
                if linear.bias is not None:
                    new.bias = torch.nn.Parameter(linear.bias.detach().clone())
            model.set_submodule(name, place_like(new, linear))

    def empty_module(self, old, scheme: dict, tensors: dict, name: str):
        return HadamardQuantLinear(scheme["in_features"], scheme["out_features"], scheme["bits"],
                                   scheme["group_size"], scheme["symmetric"], scheme["bias"], act_of(scheme),
                                   scheme["seed"])


register(HadamardRTN())
