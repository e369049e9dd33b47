"""llama.cpp's Q8_0 and Q4_0 block formats: our exact integer weights into blocks, and llama.cpp's own rounding.

Both formats cut each row (input columns) into blocks of 32 with one float16 scale ``d`` per block
(ggml-common.h ``block_q8_0`` / ``block_q4_0``):

* Q8_0: 2 bytes d, 32 int8 q; ``x = d · q``.
* Q4_0: 2 bytes d, 16 bytes of nibbles, byte j = q[j] | q[j + 16] << 4 with q in 0..15; ``x = d · (q - 8)``.

Our weights ``(code - zero) · scale`` fit a format exactly when every block lies in one of our groups (group
size a multiple of 32, or one scale per row; a shorter last group of a row width that is a multiple of 32 then
holds whole blocks too), each scale is a float16 value, and ``code - zero`` lies in the
format's signed range (-128..127 for Q8_0, -8..7 for Q4_0: our 4-bit absmax codes ±7 and GPTQ's "full" 4-bit
grid, codes 0..15 around zero point 8, both fit). :func:`llamacpp_quantize` instead rounds a float weight the
way llama.cpp's ``quantize_row_q8_0_ref`` / ``quantize_row_q4_0_ref`` do, through the ``gguf`` package's numpy
port of them.
"""

from __future__ import annotations

import numpy as np

from .errors import UserError

__all__ = ["BLOCK", "BLOCK_TYPES", "SIGNED_RANGE", "encode_blocks", "llamacpp_quantize", "representable_problem"]

BLOCK = 32
BLOCK_TYPES = ("Q8_0", "Q4_0")
SIGNED_RANGE = {"Q8_0": (-128, 127), "Q4_0": (-8, 7)}


def _qtype(name: str):
    from gguf import GGMLQuantizationType  # lazy: only GGUF users need the gguf package

    return GGMLQuantizationType[name]


def representable_problem(signed: np.ndarray, scale: np.ndarray, group: int, qtype: str) -> str | None:
    """Why integer weights ``signed`` [out, in] with per-group float scales [out, ceil(in/group)] do not fit
    ``qtype`` exactly, or None when they do."""
    cols = signed.shape[1]
    if cols % BLOCK:
        return f"rows of {cols} columns do not split into blocks of {BLOCK}"
    if group % BLOCK:
        return f"groups of {group} columns do not hold whole blocks of {BLOCK} (use a multiple of 32)"
    lo, hi = SIGNED_RANGE[qtype]
    if signed.size and (signed.min() < lo or signed.max() > hi):
        return f"integer weights span {signed.min()}..{signed.max()}, outside {qtype}'s {lo}..{hi}"
    half = scale.astype(np.float16)
    if not np.isfinite(half).all() or not np.array_equal(half.astype(scale.dtype), scale):
        return "scales are not float16 values (quantize with --dtype float16, the default, to store them so)"
    return None


def encode_blocks(signed: np.ndarray, scale: np.ndarray, group: int, qtype: str) -> np.ndarray:
    """The raw ``qtype`` bytes [out, in/32 · block bytes] of ``signed · scale`` (checked representable)."""
    problem = representable_problem(signed, scale, group, qtype)
    if problem is not None:
        raise UserError(f"not exactly representable as {qtype}: {problem}")
    rows, cols = signed.shape
    n_blocks = cols // BLOCK
    d = np.repeat(scale.astype(np.float16), group // BLOCK, axis=1)[:, :n_blocks].reshape(rows * n_blocks, 1)
    q = signed.reshape(rows * n_blocks, BLOCK)
    if qtype == "Q8_0":
        payload = q.astype(np.int8).view(np.uint8)
    else:
        u = (q + 8).astype(np.uint8)  # 0..15
        payload = u[:, :BLOCK // 2] | (u[:, BLOCK // 2:] << np.uint8(4))
    blocks = np.concatenate([d.view(np.uint8), payload], axis=1)  # (rows·n_blocks, 2 + payload bytes)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def llamacpp_quantize(weight: np.ndarray, qtype: str) -> np.ndarray:
    """llama.cpp's block rounding of a float32 weight [out, in] (in a multiple of 32): raw ``qtype`` bytes."""
    from gguf.quants import quantize

    return quantize(np.ascontiguousarray(weight, dtype=np.float32), _qtype(qtype))


def dequantize(raw: np.ndarray, qtype: str) -> np.ndarray:
    """float32 weights of raw block bytes (the ``gguf`` package's port of llama.cpp's dequantizers)."""
    from gguf.quants import dequantize as gguf_dequantize

    return gguf_dequantize(raw, _qtype(qtype))
