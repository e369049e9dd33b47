"""GPTQ (second-order, calibrated): its codes land in RTN's ``QuantLinear``, so it packs and exports as RTN."""

from __future__ import annotations

from diffquant.quant.gptq import gptq_quantize_
from diffquant.quant.methods.rtn import PackedCodes
from diffquant.quant.registry import register

__all__ = ["GPTQ"]


class GPTQ(PackedCodes):
    name, label = "gptq", "GPTQ"
    needs_calibration = True
    module_types = ()  # its modules are RTN's QuantLinear: loading them is RTN's job

    def default_grid(self, wq) -> str:
        # as GPTQ and GPTQModel; 0.09 lower perplexity on stories260K at 4 bits (experiments/results/perf.md)
        return "full" if wq.symmetric is True else "absmax"

    def quantize_(self, model, names: list[str], wq, batches: list) -> None:
        gptq_quantize_(model, names, batches, wq.bits, wq.group_size, wq.symmetric, wq.act_order, wq.damp,
                       wq.block_size, wq.grid, wq.sequential)


register(GPTQ())
