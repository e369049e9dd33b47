"""Round to nearest: per output channel or per group, absmax or "full" grid, into ``QuantLinear`` codes."""

from __future__ import annotations

from diffquant.dispatch import place_like, resident
from diffquant.quant.linear import QuantEmbedding, QuantLinear
from diffquant.quant.registry import COMPRESSED_TENSORS, GGUF, HF_DEQUANTIZED, WeightMethod, register
from diffquant.quant.rtn import rtn_codes

__all__ = ["RTN", "PackedCodes"]


class PackedCodes(WeightMethod):
    """Methods whose modules are plain ``QuantLinear`` / ``QuantEmbedding`` codes, which every runtime reads."""

    exports = frozenset({GGUF, COMPRESSED_TENSORS, HF_DEQUANTIZED})

    def check(self, wq) -> None:
        if wq.bits is None:
            raise ValueError(f"WeightQuant(method={self.name!r}) needs bits (2..8)")

    def empty_module(self, old, scheme: dict, tensors: dict, name: str):
        if scheme["type"] == "QuantEmbedding":
            return QuantEmbedding(scheme["num_embeddings"], scheme["embedding_dim"], scheme["bits"],
                                  scheme["group_size"], scheme["symmetric"])
        return QuantLinear(scheme["in_features"], scheme["out_features"], scheme["bits"], scheme["group_size"],
                           scheme["symmetric"], scheme["bias"], act_of(scheme))


def act_of(scheme: dict):
    """The input quantizer a QuantLinear scheme records (None: none)."""
    from diffquant.quant.config import ActQuant

    return None if scheme.get("act") is None else ActQuant.from_dict(scheme["act"])


class RTN(PackedCodes):
    name = "rtn"
    module_types = ("QuantLinear", "QuantEmbedding")

    def quantize_(self, model, names: list[str], wq, batches: list) -> None:
        for name in names:
            linear = model.get_submodule(name)
            with resident(linear):  # offloaded (device_map): loaded for this layer only, then written back
                codes, scale, zero = rtn_codes(linear.weight, wq.bits, wq.group_size, wq.symmetric, wq.grid)
                quantized = QuantLinear.from_codes(linear, codes, scale, zero, wq.bits, wq.group_size)
            model.set_submodule(name, place_like(quantized, linear))


register(RTN())
