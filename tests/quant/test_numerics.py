"""Quantization numerics against independent NumPy references written from the docs/ARCHITECTURE.md formulas."""

import itertools
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diffquant.quant import (
    FLOAT_FORMATS,
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

GRANULARITIES = [PerTensor(), PerAxis((0,)), PerAxis((-1,)), PerAxis((0, 1)), PerGroup(16)]


def randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def student_t(*shape, seed, df=2):
    """Heavy-tailed samples: z / sqrt(chi2_df / df), from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, generator=g)
    chi2 = torch.randn(df, *shape, generator=g).pow(2).sum(0)
    return z / (chi2 / df).sqrt()


# ----------------------------------------------------------------------------- NumPy references


def ref_symmetric(x, bits, axis, mask=None):
    """Symmetric absmax in x's NumPy dtype; ``axis`` = the reduced axes (None = all)."""
    qmax = x.dtype.type(2 ** (bits - 1) - 1)
    a = np.abs(x) if mask is None else np.where(mask, np.abs(x), 0)
    scale = a.max(axis=axis, keepdims=True) / qmax
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.clip(np.round(x / scale), -qmax, qmax), 0)
    return q, scale, q * scale


def ref_asymmetric(x, bits, axis):
    qmax = x.dtype.type(2**bits - 1)
    lo = np.minimum(x.min(axis=axis, keepdims=True), 0)
    hi = np.maximum(x.max(axis=axis, keepdims=True), 0)
    scale = (hi - lo) / qmax
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(scale > 0, np.clip(np.round(-lo / scale), 0, qmax), 0)
        q = np.where(scale > 0, np.clip(np.round(x / scale) + zero, 0, qmax), 0)
    return q, scale, zero, (q - zero) * scale


def grouped_np(x, g):
    return x.reshape(*x.shape[:-1], x.shape[-1] // g, g)


# ----------------------------------------------------------------------------- exact references


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8, 12, 16])
def test_per_tensor_symmetric_is_bit_exact_against_float32_reference(bits):
    x = randn(64, 96, seed=bits)
    q_ref, s_ref, y_ref = ref_symmetric(x.numpy(), bits, axis=None)
    qt = quantize_tensor(x, bits)
    assert qt.scale.dtype == torch.float32 and qt.scale.shape == (1, 1)
    np.testing.assert_array_equal(qt.scale.numpy(), s_ref)
    np.testing.assert_array_equal(qt.codes.numpy(), q_ref)
    # Exact: the same IEEE float32 operations in the same order give the same bits.
    assert np.array_equal(fake_quantize(x, bits, "tensor").numpy().view(np.int32), y_ref.view(np.int32))


@pytest.mark.parametrize("bits", [3, 4, 8, 16])
def test_per_tensor_symmetric_agrees_with_float64_reference(bits):
    x = randn(128, 128, seed=100 + bits)
    x64 = x.numpy().astype(np.float64)
    q64, s64, y64 = ref_symmetric(x64, bits, axis=None)
    qt = quantize_tensor(x, bits)
    # The float32 scale is the float64 one rounded once.
    assert abs(qt.scale.item() - s64.item()) <= s64.item() * 2.0**-24
    # Codes agree except where x/scale lies within float32 noise of a rounding tie, and then by one.
    v = x64 / s64
    near_tie = np.abs(np.abs(v - np.floor(v)) - 0.5) < 1e-4
    diff = np.abs(qt.codes.numpy().astype(np.int64) - q64.astype(np.int64))
    assert diff.max() <= 1 and not np.any(diff[~near_tie])
    y = fake_quantize(x, bits).numpy().astype(np.float64)
    same = diff == 0
    assert np.all(np.abs(y - y64)[same] <= np.abs(y64)[same] * 2.0**-23)


@pytest.mark.parametrize(
    "shape, gran, axis",
    [
        ((4, 6, 32), PerAxis((0, 1)), 2),  # per token of [B, T, D]
        ((3, 2, 5, 7), PerAxis((0,)), (1, 2, 3)),  # per sequence of [B, H, T, S]
        ((3, 2, 5, 7), PerAxis((0, 1)), (2, 3)),  # per sequence and head
        ((48, 40), PerAxis((-1,)), 0),  # per column, negative axis
        ((48, 40), PerAxis(0), 1),  # per row, int shorthand
    ],
)
@pytest.mark.parametrize("bits", [4, 8])
def test_per_axis_symmetric_is_bit_exact(shape, gran, axis, bits):
    x = randn(*shape, seed=bits + len(shape))
    q_ref, s_ref, y_ref = ref_symmetric(x.numpy(), bits, axis=axis)
    qt = quantize_tensor(x, bits, gran)
    np.testing.assert_array_equal(qt.scale.numpy(), s_ref)
    np.testing.assert_array_equal(qt.codes.numpy(), q_ref)
    np.testing.assert_array_equal(fake_quantize(x, bits, gran).numpy(), y_ref)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("g", [1, 8, 32, 64])
def test_per_group_is_bit_exact(symmetric, g):
    x, bits = randn(3, 10, 64, seed=g), 4
    xg = grouped_np(x.numpy(), g)
    if symmetric:
        q_ref, s_ref, y_ref = ref_symmetric(xg, bits, axis=-1)
    else:
        q_ref, s_ref, z_ref, y_ref = ref_asymmetric(xg, bits, axis=-1)
    qt = quantize_tensor(x, bits, PerGroup(g), symmetric=symmetric)
    assert qt.scale.shape == (3, 10, 64 // g)
    np.testing.assert_array_equal(qt.scale.numpy(), s_ref[..., 0])
    np.testing.assert_array_equal(qt.codes.numpy(), q_ref.reshape(x.shape))
    if not symmetric:
        np.testing.assert_array_equal(qt.zero.numpy(), z_ref[..., 0])
    y = fake_quantize(x, bits, f"group:{g}", symmetric=symmetric)
    np.testing.assert_array_equal(y.numpy(), y_ref.reshape(x.shape))


@pytest.mark.parametrize("bits", [2, 4, 8, 16])
@pytest.mark.parametrize("gran, axis", [(PerTensor(), None), (PerAxis((0,)), 1)])
def test_asymmetric_is_bit_exact(bits, gran, axis):
    x = randn(32, 50, seed=bits) + 0.7  # off-centre so lo and hi differ in size
    q_ref, s_ref, z_ref, y_ref = ref_asymmetric(x.numpy(), bits, axis)
    qt = quantize_tensor(x, bits, gran, symmetric=False)
    np.testing.assert_array_equal(qt.scale.numpy(), s_ref)
    np.testing.assert_array_equal(qt.zero.numpy(), z_ref)
    np.testing.assert_array_equal(qt.codes.numpy(), q_ref)
    np.testing.assert_array_equal(fake_quantize(x, bits, gran, symmetric=False).numpy(), y_ref)


# ----------------------------------------------------------------------------- codes and round trips


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", range(2, 17))
def test_codes_dtype_and_range(bits, symmetric):
    x = randn(40, 64, seed=bits)
    qt = quantize_tensor(x, bits, PerAxis((0,)), symmetric=symmetric)
    lo, hi = code_range(bits, symmetric)
    expected = torch.int8 if hi <= 127 else torch.int16 if hi <= 32767 else torch.int32
    assert qt.codes.dtype == expected and qt.codes.shape == x.shape
    assert lo <= qt.codes.min().item() and qt.codes.max().item() <= hi
    if symmetric:  # each row's absmax entry lands exactly on +-qmax
        assert torch.all(qt.codes.abs().amax(dim=1) == hi) and qt.zero is None
    else:
        assert qt.zero.dtype == expected and torch.all((qt.zero >= 0) & (qt.zero <= hi))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("gran", GRANULARITIES, ids=repr)
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantize_dequantize_equals_fake_quantize(dtype, gran, symmetric):
    x = randn(6, 5, 32, seed=7, dtype=dtype) * 3
    qt = quantize_tensor(x, 5, gran, symmetric=symmetric)
    assert isinstance(qt, QTensor) and qt.dtype == dtype
    assert qt.scale.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    y = fake_quantize(x, 5, gran, symmetric=symmetric)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(dequantize(*qt), y)
    assert torch.equal(dequantize(qt.codes, qt.scale, qt.zero, dtype=dtype), y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    x = randn(16, 48, seed=3, dtype=dtype)
    for symmetric in (True, False):
        y = fake_quantize(x, 6, PerAxis((0,)), symmetric=symmetric)
        assert torch.equal(y, fake_quantize(x.float(), 6, PerAxis((0,)), symmetric=symmetric).to(dtype))


@pytest.mark.parametrize("gran", GRANULARITIES, ids=repr)
@pytest.mark.parametrize("bits", [3, 8])
def test_asymmetric_round_trip_error_is_at_most_half_a_step(gran, bits):
    x = randn(4, 6, 32, seed=bits).exp()  # one-signed, skewed data
    qt = quantize_tensor(x, bits, gran, symmetric=False)
    y = dequantize(*qt)
    scale = qt.scale.unsqueeze(-1) if isinstance(gran, PerGroup) else qt.scale
    err = (y - x).reshape(*qt.scale.shape, -1) if isinstance(gran, PerGroup) else y - x
    assert torch.all(err.abs() <= scale * 0.5 * (1 + 1e-5))


def test_zero_slices_stay_zero():
    x = randn(5, 16, seed=11)
    x[2] = 0.0
    for symmetric in (True, False):
        qt = quantize_tensor(x, 4, PerAxis((0,)), symmetric=symmetric)
        assert qt.scale[2].item() == 0 and torch.all(qt.codes[2] == 0)
        y = fake_quantize(x, 4, PerAxis((0,)), symmetric=symmetric)
        assert torch.all(y[2] == 0) and torch.isfinite(y).all()
        assert torch.equal(dequantize(*qt), y)
    z = torch.zeros(3, 8)
    for y in (fake_quantize(z, 8), fake_quantize(z, 8, symmetric=False), fake_quantize_float(z, "fp8_e4m3")):
        assert torch.equal(y, z)


def test_ties_round_half_to_even():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -3.5, 7.0])  # amax 7 at 4 bits: scale 1, x / scale exact
    assert quantize_tensor(x, 4).codes.tolist() == [0, 2, 2, 0, -4, 7]
    assert fake_quantize(x, 4).tolist() == [0.0, 2.0, 2.0, 0.0, -4.0, 7.0]


@pytest.mark.parametrize("c", [3.0, -2.5, 1e-30, 7e5])
def test_constant_slices_have_no_nan(c):
    x = torch.full((4, 10), c)
    for symmetric in (True, False):
        y = fake_quantize(x, 4, PerAxis((0,)), symmetric=symmetric)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, x, rtol=1e-6, atol=0)


def test_zero_dim_and_elementwise_slices():
    x = torch.tensor(-1.75)
    assert torch.equal(fake_quantize(x, 3), x) and quantize_tensor(x, 3).codes.item() == -3
    v = randn(9, seed=2)
    torch.testing.assert_close(fake_quantize(v, 2, PerAxis((0,))), v, rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- error floors


FLOOR_MARGIN_DB = {PerTensor(): 13.0, PerAxis((0,)): 11.0, PerGroup(32): 9.5}


@pytest.mark.parametrize("gran", list(FLOOR_MARGIN_DB), ids=repr)
@pytest.mark.parametrize("symmetric", [True, False])
def test_sqnr_floor_on_gaussian_data(gran, symmetric):
    x = randn(256, 256, seed=21)
    for bits in range(2, 17):
        got = sqnr(x, fake_quantize(x, bits, gran, symmetric=symmetric))
        assert got >= 6.02 * bits - FLOOR_MARGIN_DB[gran], (bits, got)
    assert sqnr(x, fake_quantize(x, 8, "tensor")) >= 38.0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(64, 512), symmetric=st.booleans())
def test_sqnr_grows_with_bits(seed, n, symmetric):
    # Absmax grids of consecutive bit widths are not nested, so strict growth is a property of typical
    # (Gaussian, n >= 64) data; a handful of heavy-tailed values can break it, the error bound below not.
    x = randn(n, seed=seed)
    s = [sqnr(x, fake_quantize(x, b, symmetric=symmetric)) for b in range(2, 17)]
    assert all(b > a for a, b in itertools.pairwise(s)), s


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1), n=st.integers(1, 300), bits=st.integers(2, 16), symmetric=st.booleans()
)
def test_error_is_at_most_half_a_step_on_heavy_tails(seed, n, bits, symmetric):
    x = student_t(n, seed=seed)
    qt = quantize_tensor(x, bits, symmetric=symmetric)
    assert torch.all((dequantize(*qt) - x).abs() <= qt.scale * 0.5 * (1 + 1e-5))


def test_per_group_beats_per_tensor_on_heavy_tails():
    x = student_t(128, 256, seed=5)
    for bits in (4, 8):
        per_tensor = sqnr(x, fake_quantize(x, bits, PerTensor()))
        per_group = sqnr(x, fake_quantize(x, bits, PerGroup(32)))
        assert per_group > per_tensor + 6.0, (bits, per_tensor, per_group)


# ----------------------------------------------------------------------------- masks


def causal_logits(seed, b=2, h=3, t=12):
    x = randn(b, h, t, t, seed=seed) * 4
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return x, mask


@pytest.mark.parametrize("gran", [PerTensor(), PerAxis((0,)), PerAxis((0, 1)), PerGroup(4)], ids=repr)
@pytest.mark.parametrize("symmetric", [True, False])
def test_mask_ignores_planted_outlier(gran, symmetric):
    x, mask = causal_logits(seed=8)
    planted = x.clone()
    # Above the causal diagonal, so masked out, in groups of 4 that keep some entries.
    planted[1, 2, 9, 11] = 1e4
    planted[0, 0, 5, 7] = -1e4
    clean = quantize_tensor(x, 4, gran, symmetric=symmetric, mask=mask)
    qt = quantize_tensor(planted, 4, gran, symmetric=symmetric, mask=mask)
    assert torch.equal(qt.scale, clean.scale)
    if not symmetric:
        assert torch.equal(qt.zero, clean.zero)
    # Unmasked entries are unchanged; the planted ones clamp to the end of the code range.
    assert torch.equal(qt.codes[..., mask], clean.codes[..., mask])
    lo, hi = code_range(4, symmetric)
    assert qt.codes[1, 2, 9, 11].item() == hi and qt.codes[0, 0, 5, 7].item() == lo
    assert torch.equal(fake_quantize(planted, 4, gran, symmetric=symmetric, mask=mask), dequantize(*qt))


def test_mask_matches_reference_that_excludes_masked_entries():
    x, mask = causal_logits(seed=9)
    xn, mn = x.numpy(), np.broadcast_to(mask.numpy(), x.shape)
    for axis, gran in ((None, PerTensor()), ((1, 2, 3), PerAxis((0,))), ((2, 3), PerAxis((0, 1)))):
        _, s_ref, y_ref = ref_symmetric(xn, 6, axis=axis, mask=mn)
        qt = quantize_tensor(x, 6, gran, mask=mask)
        np.testing.assert_array_equal(qt.scale.numpy(), s_ref)
        np.testing.assert_array_equal(fake_quantize(x, 6, gran, mask=mask).numpy(), y_ref)


def test_fully_masked_slice_dequantizes_to_zero():
    x = randn(3, 8, seed=4)
    mask = torch.tensor([True, False, True]).unsqueeze(1)
    for symmetric in (True, False):
        y = fake_quantize(x, 8, PerAxis((0,)), symmetric=symmetric, mask=mask)
        assert torch.all(y[1] == 0) and torch.isfinite(y).all()


def test_fp8_mask_keeps_masked_outliers_finite():
    x, mask = causal_logits(seed=10)
    x[0, 0, 0, 5] = 1e6
    y = fake_quantize_float(x, "fp8_e5m2", mask=mask)
    amax = x[..., mask].abs().max()
    assert torch.isfinite(y).all() and y.abs().max() <= amax * (1 + 1e-6)


# ----------------------------------------------------------------------------- inputs untouched


def test_inputs_are_never_modified():
    for dtype in (torch.float32, torch.float16):
        x, mask = causal_logits(seed=12)
        x = x.to(dtype)
        before, mask_before = x.clone(), mask.clone()
        outs = [
            fake_quantize(x, 4),
            fake_quantize(x, 4, PerGroup(4), symmetric=False, mask=mask),
            fake_quantize(x, 16, PerAxis((0, 1, 2, 3))),
            quantize_tensor(x, 8, PerAxis((0,)), mask=mask).codes,
            *(fake_quantize_float(x, fmt, mask=mask) for fmt in FLOAT_FORMATS),
        ]
        assert torch.equal(x, before) and torch.equal(mask, mask_before)
        assert all(o.data_ptr() != x.data_ptr() for o in outs)
    same_dtype = torch.ones(4, dtype=torch.bfloat16)
    assert fake_quantize_float(same_dtype, "bf16") is not same_dtype


# ----------------------------------------------------------------------------- float formats


# name -> (unit roundoff 2**-p, half the subnormal step) of the format, for |x_hat - x| <= u|x| + h·scale.
FLOAT_BOUNDS = {
    "fp16": (2.0**-11, 2.0**-25),
    "bf16": (2.0**-8, 0.0),
    "fp8_e4m3": (2.0**-4, 2.0**-10),
    "fp8_e5m2": (2.0**-3, 2.0**-17),
}


@pytest.mark.parametrize("fmt", list(FLOAT_FORMATS))
@pytest.mark.parametrize("gran", [PerTensor(), PerAxis((0,))], ids=repr)
def test_float_format_round_trip_error_bounds(fmt, gran):
    x = randn(64, 128, seed=13) * 2
    y = fake_quantize_float(x, fmt, gran)
    assert y.dtype == x.dtype and y.shape == x.shape
    u, h = FLOAT_BOUNDS[fmt]
    scaled = FLOAT_FORMATS[fmt][1]
    dims = (1,) if isinstance(gran, PerAxis) else (0, 1)
    amax = x.abs().amax(dim=dims, keepdim=True)
    scale = amax / torch.finfo(FLOAT_FORMATS[fmt][0]).max if scaled else torch.ones(())
    assert torch.all((y - x).abs() <= u * (1 + 1e-5) * x.abs() + h * scale)
    assert 0 < (y - x).abs().max()  # it really rounds
    if scaled:  # each slice's absmax entry survives to within float32 rounding
        torch.testing.assert_close(y.abs().amax(dim=dims, keepdim=True), amax, rtol=2e-7, atol=0)


def test_float_formats_order_by_precision():
    x = randn(128, 128, seed=14)
    s = {fmt: sqnr(x, fake_quantize_float(x, fmt)) for fmt in FLOAT_FORMATS}
    assert s["fp16"] > s["bf16"] > s["fp8_e4m3"] > s["fp8_e5m2"] > 20


def test_fp8_values_lie_on_the_scaled_grid():
    x = randn(32, 32, seed=15, dtype=torch.float64)
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        fdt = FLOAT_FORMATS[fmt][0]
        scale = x.abs().max() / torch.finfo(fdt).max
        y = fake_quantize_float(x, fmt)
        assert y.dtype == torch.float64
        v = y / scale
        assert torch.equal(v.to(fdt).to(torch.float64), v)


# ----------------------------------------------------------------------------- sqnr, parsing, errors


def test_sqnr_values():
    x = torch.ones(4)
    assert sqnr(x, x.clone()) == math.inf
    assert sqnr(x, torch.full((4,), 0.9)) == pytest.approx(20.0)
    assert sqnr(torch.zeros(3), torch.ones(3)) == -math.inf


def test_granularity_strings():
    assert as_granularity("tensor") == PerTensor()
    assert as_granularity("row") == PerAxis((0,))
    assert as_granularity("group:128") == PerGroup(128)
    assert as_granularity(PerAxis((0, 1))) == PerAxis((0, 1))
    assert hash(PerAxis([0, 1])) == hash(PerAxis((0, 1)))  # frozen and hashable


def one_line_value_error(fn, match):
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bits", [1, 17, 4.5, 0, True, "8", None])
def test_bad_bits_raise(bits):
    x = randn(4, 4, seed=0)
    expected = re.escape(f"bits must be an integer in 2..16, got {bits!r}")
    one_line_value_error(lambda: quantize_tensor(x, bits), expected)
    one_line_value_error(lambda: fake_quantize(x, bits), expected)


def test_bad_arguments_raise():
    x = randn(4, 16, seed=0)
    one_line_value_error(lambda: fake_quantize(torch.tensor(1.0), 4, PerGroup(2)), "needs a last dim")
    one_line_value_error(lambda: PerGroup(0), "group_size must be a positive integer")
    one_line_value_error(lambda: PerAxis(("a",)), "PerAxis axes must be integers")
    one_line_value_error(lambda: fake_quantize(x, 4, PerAxis((2,))), "axis 2 out of range")
    one_line_value_error(lambda: fake_quantize(x, 4, PerAxis((1, -1))), "duplicate axes")
    one_line_value_error(lambda: fake_quantize(torch.arange(4), 4), "floating-point tensor, got torch.int64")
    one_line_value_error(lambda: quantize_tensor(torch.ones(3, dtype=torch.int8), 4), "floating-point")
    one_line_value_error(lambda: fake_quantize(x, 4, mask=torch.ones(4, 16)), "mask must be a bool tensor")
    one_line_value_error(lambda: fake_quantize(x, 4, mask=torch.ones(3, 16, dtype=torch.bool)), "broadcast")
    one_line_value_error(
        lambda: fake_quantize(x, 4, mask=torch.ones(2, 4, 16, dtype=torch.bool)), "broadcast"
    )
    one_line_value_error(lambda: fake_quantize(x, 4, "token"), "unknown granularity 'token'")
    one_line_value_error(lambda: fake_quantize_float(x, "fp4"), "unknown float format 'fp4'")
    one_line_value_error(lambda: dequantize(torch.zeros(4, 16), torch.ones(4, 3)), "neither broadcasts")
    one_line_value_error(lambda: sqnr(x, x[:2]), "equal shapes")


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_ragged_last_group_is_quantized_over_its_own_columns(symmetric):
    x = randn(3, 4, 22, seed=5)  # groups of 8: 8 + 8 + 6
    qt = quantize_tensor(x, 4, "group:8", symmetric=symmetric)
    assert qt.scale.shape == (3, 4, 3) and qt.group_size == 8 and qt.codes.shape == x.shape
    parts = [quantize_tensor(x[..., c:c + 8].contiguous(), 4, PerAxis((0, 1)), symmetric) for c in (0, 8, 16)]
    assert torch.equal(qt.codes, torch.cat([p.codes for p in parts], dim=-1))
    assert torch.equal(qt.scale, torch.cat([p.scale for p in parts], dim=-1))
    y = dequantize(*qt)
    assert torch.equal(y, fake_quantize(x, 4, PerGroup(8), symmetric))
    assert torch.equal(y, torch.cat([dequantize(*p) for p in parts], dim=-1))
    one_line_value_error(lambda: dequantize(qt.codes, qt.scale, qt.zero, group_size=5),
                         "not the number of groups of 5 columns")
