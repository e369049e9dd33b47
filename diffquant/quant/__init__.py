"""Quantization: numerics, dynamic quantizers at probes and Linear inputs, weight RTN / GPTQ / bitsandbytes,
``quantize_`` / ``quantize`` (see docs/ARCHITECTURE.md, section 9). Packed quantized checkpoints are a
checkpoint format: ``diffquant.checkpoint.save_quantized`` / ``load_quantized`` (quant never builds models).

Names: ``diffquant.quant.quantize`` stays the tensor-level ``numerics.quantize`` (codes, scale, zero); the model
entry points are ``quantize_`` (in place) and ``quantize_model`` (a copy), which ``diffquant`` exports as
``dq.quantize_`` / ``dq.quantize``.
"""

from diffquant.quant.act import InputQuantLinear, QuantProbe, act_granularity, quantize_activation
from diffquant.quant.api import default_filter, is_quantized, quantize_
from diffquant.quant.api import quantize as quantize_model
from diffquant.quant.config import ActQuant, QuantConfig, WeightQuant
from diffquant.quant.gptq import gptq_codes, gptq_quantize_
from diffquant.quant.linear import QuantEmbedding, QuantLinear, pack_codes, unpack_codes
from diffquant.quant.numerics import (
    FLOAT_FORMATS,
    Granularity,
    PerAxis,
    PerGroup,
    PerTensor,
    QTensor,
    as_granularity,
    code_range,
    dequantize,
    fake_quantize,
    fake_quantize_float,
    quantize,
    sqnr,
)
from diffquant.quant.rtn import rtn_codes

__all__ = [
    "ActQuant",
    "InputQuantLinear",
    "QuantConfig",
    "QuantEmbedding",
    "QuantLinear",
    "QuantProbe",
    "WeightQuant",
    "act_granularity",
    "default_filter",
    "gptq_codes",
    "gptq_quantize_",
    "is_quantized",
    "pack_codes",
    "quantize_",
    "quantize_activation",
    "quantize_model",
    "rtn_codes",
    "unpack_codes",
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
    "quantize",
    "sqnr",
]
