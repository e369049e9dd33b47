"""Round-to-nearest weights, code packing and the QuantLinear / QuantEmbedding modules."""

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from diffquant.quant import (
    ActQuant,
    PerAxis,
    PerGroup,
    QuantEmbedding,
    QuantLinear,
    code_range,
    fake_quantize,
    pack_codes,
    rtn_codes,
    unpack_codes,
)


@given(bits=st.integers(2, 8), symmetric=st.booleans(), rows=st.integers(1, 4), cols=st.integers(1, 9),
       seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_packing_round_trips_exactly(bits, symmetric, rows, cols, seed):
    lo, hi = code_range(bits, symmetric)
    codes = torch.randint(lo, hi + 1, (rows, cols), generator=torch.Generator().manual_seed(seed))
    packed = pack_codes(codes, bits, symmetric)
    assert packed.dtype == torch.uint8
    assert packed.shape == (rows, (cols + 1) // 2 if bits <= 4 else cols)
    assert torch.equal(unpack_codes(packed, bits, symmetric, cols), codes.to(torch.int16))


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    codes = torch.tensor([[-7, 7, 0, 1, -1]])  # symmetric 4-bit: stored = code + 7
    packed = pack_codes(codes, 4, True)
    assert packed.tolist() == [[0 | (14 << 4), 7 | (8 << 4), 6]]
    with pytest.raises(ValueError, match="outside"):
        pack_codes(torch.tensor([[8]]), 4, True)


@pytest.mark.parametrize("bits, group_size, symmetric", [(4, None, True), (4, 16, True), (3, 32, False),
                                                         (8, None, False), (6, 8, True)])
def test_rtn_equals_the_numerics_reference(bits, group_size, symmetric):
    w = torch.randn(24, 64)
    codes, scale, zero = rtn_codes(w, bits, group_size, symmetric)
    n_groups = 1 if group_size is None else 64 // group_size
    assert scale.shape == (24, n_groups) and (zero is None) == symmetric
    gran = PerAxis((0,)) if group_size is None else PerGroup(group_size)
    expected = fake_quantize(w, bits, gran, symmetric)
    layer = QuantLinear(64, 24, bits, group_size, symmetric)
    layer.set_codes(codes, scale, zero)
    assert torch.equal(layer.dequantized_weight(), expected)
    assert torch.equal(layer.codes(), codes.to(torch.int16))


def test_rtn_per_group_matches_a_loop_reference():
    w = torch.randn(5, 32, dtype=torch.float64)
    codes, scale, _ = rtn_codes(w, 4, 8)
    for r in range(5):
        for g in range(4):
            chunk = w[r, 8 * g:8 * g + 8]
            s = chunk.abs().max() / 7
            assert scale[r, g] == s
            assert torch.equal(codes[r, 8 * g:8 * g + 8].double(), torch.clamp(torch.round(chunk / s), -7, 7))


def ragged_rtn_reference(w: torch.Tensor, bits: int, g: int, symmetric: bool, grid: str = "absmax"):
    """RTN by explicit loops over groups of g columns, the last one shorter: (codes, scales, zeros, weight)."""
    rows, cols = w.shape
    starts = range(0, cols, g)
    codes, w_hat = torch.zeros(rows, cols, dtype=torch.float64), torch.zeros(rows, cols, dtype=torch.float64)
    scales, zeros = torch.zeros(rows, len(starts), dtype=torch.float64), torch.zeros(rows, len(starts))
    for r in range(rows):
        for k, c0 in enumerate(starts):
            chunk = w[r, c0:c0 + g]
            if grid == "full":  # all 2**bits levels around zero point 2**(bits-1)
                s, z, lo, hi = 2 * chunk.abs().max() / (2**bits - 1), 2 ** (bits - 1), 0, 2**bits - 1
            elif symmetric:
                s, z, lo, hi = chunk.abs().max() / (2 ** (bits - 1) - 1), 0, -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
            else:
                mn, mx = min(chunk.min().item(), 0.0), max(chunk.max().item(), 0.0)
                s = torch.tensor((mx - mn) / (2**bits - 1), dtype=torch.float64)
                z, lo, hi = min(max(round(-mn / s.item()), 0), 2**bits - 1), 0, 2**bits - 1
            q = torch.clamp(torch.round(chunk / s) + z, lo, hi)
            codes[r, c0:c0 + g], scales[r, k], zeros[r, k] = q, s, z
            w_hat[r, c0:c0 + g] = (q - z) * s
    return codes, scales, zeros, w_hat


@pytest.mark.parametrize("bits, g, symmetric, grid", [(4, 24, True, "absmax"), (3, 7, False, "absmax"),
                                                      (4, 24, True, "full"), (8, 100, True, "absmax")])
def test_ragged_last_group_matches_a_float64_loop_reference(bits, g, symmetric, grid):
    torch.manual_seed(bits + g)
    w = torch.randn(6, 58, dtype=torch.float64) * torch.rand(6, 1, dtype=torch.float64) * 3  # 58 = 2·24 + 10
    codes, scale, zero = rtn_codes(w, bits, g, symmetric, grid)
    ref_codes, ref_scale, ref_zero, ref_w = ragged_rtn_reference(w, bits, g, symmetric, grid)
    assert scale.shape == (6, -(-58 // g)) and torch.equal(scale, ref_scale)
    assert torch.equal(codes.double(), ref_codes)
    assert (zero is None) == (symmetric and grid == "absmax")
    if zero is not None:
        assert torch.equal(zero.double(), ref_zero.double())
    layer = QuantLinear(58, 6, bits, g, symmetric=zero is None)
    layer.set_codes(codes, scale, zero)
    assert torch.equal(layer.codes(), codes.to(torch.int16))
    assert torch.equal(layer.dequantized_weight(torch.float64), ref_w)  # unpacked exactly, groups expanded right
    if grid == "absmax":
        assert torch.equal(fake_quantize(w, bits, PerGroup(g), symmetric), ref_w)


def test_quant_linear_forward_and_the_float_layer_untouched():
    linear = nn.Linear(32, 12, bias=True)
    before = copy.deepcopy(linear.state_dict())
    q = QuantLinear.from_float(linear, 4, 16)
    assert all(torch.equal(before[k], v) for k, v in linear.state_dict().items())
    x = torch.randn(3, 7, 32)
    w_hat = fake_quantize(linear.weight.detach(), 4, PerGroup(16))
    assert torch.equal(q(x), F.linear(x, w_hat, linear.bias))
    assert set(q.state_dict()) == {"qweight", "scale", "bias"}
    assert q.qweight.dtype == torch.uint8 and q.qweight.shape == (12, 16)


def test_input_quantization_inside_quant_linear():
    linear = nn.Linear(16, 8, bias=False)
    q = QuantLinear.from_float(linear, 8, act=ActQuant(4, "token"))
    x = torch.randn(2, 5, 16)
    x_hat = fake_quantize(x, 4, PerAxis((0, 1)))
    assert torch.equal(q(x), F.linear(x_hat, q.dequantized_weight()))


def test_the_dequantized_weight_cache_follows_loads_and_dtypes():
    a = QuantLinear.from_float(nn.Linear(16, 8, bias=False), 4)
    b = QuantLinear.from_float(nn.Linear(16, 8, bias=False), 4)
    x = torch.randn(3, 16)
    a(x)  # fills the cache
    a.load_state_dict(b.state_dict())
    assert torch.equal(a(x), b(x))
    wide = a.to(torch.float64)(x.double())
    assert wide.dtype == torch.float64 and torch.allclose(wide.float(), b(x))


def test_quant_embedding_looks_up_quantized_rows():
    emb = nn.Embedding(20, 16)
    q = QuantEmbedding.from_float(emb, 4, 8, symmetric=False)
    ids = torch.randint(0, 20, (2, 6))
    expected = F.embedding(ids, fake_quantize(emb.weight.detach(), 4, PerGroup(8), symmetric=False))
    assert torch.equal(q(ids), expected)
