"""bitsandbytes LLM.int8 (``bnb-int8``), NF4 and FP4 layers: their own formats, exported nowhere else."""

from __future__ import annotations

from diffquant.quant.bnb import bnb_empty_module, bnb_quantize_, bnb_scheme, import_bnb
from diffquant.quant.registry import WeightMethod, register

__all__ = ["Bitsandbytes"]


class Bitsandbytes(WeightMethod):
    sweepable = False  # the bit width is the method's
    takes_input_quant = False  # brings its own activation handling
    keeps_float_dtype = True  # absmax, SCB and quant maps are part of its format

    def __init__(self, name: str, bits: int, prebuilt: bool):
        self.name, self.fixed_bits, self.module_types = name, bits, (name,)
        self.loads_extra_keys = prebuilt  # 4-bit layers are rebuilt from their extra statistics keys

    def check(self, wq) -> None:
        if wq.bits is None:
            object.__setattr__(wq, "bits", self.fixed_bits)  # implied by the method; stored for JSON and reports
        elif wq.bits != self.fixed_bits:
            raise ValueError(f"{self.name} is {self.fixed_bits}-bit, got bits={wq.bits!r}")
        if wq.group_size is not None or not wq.symmetric or wq.act_order or wq.grid != "absmax":
            raise ValueError(f"{self.name} takes no group_size, symmetric, grid or act_order settings")

    def check_model(self, wq, linears: list[str], embeddings: list[str], batches: list) -> None:
        import_bnb()  # fails here, with the extra to install, when missing
        if embeddings:
            raise ValueError(f"{self.name} quantizes Linear layers only; drop embeddings=True")

    def quantize_(self, model, names: list[str], wq, batches: list) -> None:
        bnb_quantize_(model, names, wq)

    def owns(self, module) -> bool:
        return type(module).__module__.startswith("bitsandbytes") and bnb_scheme(module)["type"] == self.name

    def scheme(self, module) -> dict:
        return bnb_scheme(module)

    def empty_module(self, old, scheme: dict, tensors: dict, name: str):
        return bnb_empty_module(old, scheme, tensors, name)


for _name, _bits, _prebuilt in (("bnb-int8", 8, False), ("bnb-nf4", 4, True), ("bnb-fp4", 4, True)):
    register(Bitsandbytes(_name, _bits, _prebuilt))
