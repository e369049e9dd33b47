"""Quantization: numerics now; quantizers and ``quantize_`` join later (see DESIGN.md)."""

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
    "quantize",
    "sqnr",
]
