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
