"""Quantization: numerics, dynamic quantizers at probes and Linear inputs, weight methods (registered handlers,
:mod:`diffquant.quant.registry`: RTN, GPTQ, bitsandbytes, Hadamard-rotated RTN) and the entry points
``quantize_`` / ``quantize`` (see docs/ARCHITECTURE.md, section 4.2).

Names: ``quantize_`` (in place) and ``quantize`` (a copy; also ``quantize_model``) take a model, as
``dq.quantize_`` / ``dq.quantize`` do; the tensor-level function is ``quantize_tensor`` (codes, scale, zero), next
to ``dequantize`` and ``fake_quantize``. Packed quantized checkpoints are a checkpoint format:
``diffquant.checkpoint.save_quantized`` / ``load_quantized`` (quant never builds models).
"""

from diffquant.quant import methods  # noqa: F401  (registers the weight methods before anything asks for one)
from diffquant.quant.act import InputQuantLinear, QuantProbe, act_granularity, quantize_activation
from diffquant.quant.api import default_filter, is_quantized, quantize, quantize_
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
    quantize_tensor,
    sqnr,
)
from diffquant.quant.registry import WeightMethod, register, weight_method, weight_methods
from diffquant.quant.rtn import rtn_codes

quantize_model = quantize  # the name this package used while ``quantize`` was the tensor function

__all__ = [
    "ActQuant",
    "InputQuantLinear",
    "QuantConfig",
    "QuantEmbedding",
    "QuantLinear",
    "QuantProbe",
    "WeightMethod",
    "WeightQuant",
    "act_granularity",
    "default_filter",
    "gptq_codes",
    "gptq_quantize_",
    "is_quantized",
    "pack_codes",
    "quantize",
    "quantize_",
    "quantize_activation",
    "quantize_model",
    "register",
    "rtn_codes",
    "unpack_codes",
    "weight_method",
    "weight_methods",
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
    "quantize_tensor",
    "sqnr",
]
