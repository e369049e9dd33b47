"""Hadamard-rotated RTN: exact codes and outputs against an independent float64 reference, the SQNR it gains on
weights with outlier columns, packed round trip, and the exports it refuses in one line."""

import math

import pytest
import scipy.linalg
import torch
from torch import nn

from diffquant import CheckpointError, build_model
from diffquant.checkpoint import load_quantized, save_quantized
from diffquant.compressed import save_compressed
from diffquant.gguf_export import save_gguf
from diffquant.quant import QuantConfig, WeightQuant, quantize, quantize_, rtn_codes, sqnr, weight_method
from diffquant.quant.methods.hadamard import HadamardQuantLinear
from tests.conftest import tiny_config
from tests.helpers import randomize_


def reference_rotation(signs: torch.Tensor) -> torch.Tensor:
    """diag(signs) · blockdiag(H_n / √n) in float64, H_n from scipy, n the largest power of two dividing the width."""
    width = signs.numel()
    n = 1 << (width & -width).bit_length() - 1
    block = torch.from_numpy(scipy.linalg.hadamard(n)).to(torch.float64) / math.sqrt(n)
    return torch.diag(signs.to(torch.float64)) @ torch.block_diag(*[block] * (width // n))


def reference_codes(w: torch.Tensor, bits: int, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax RTN per row (or per group of columns), written out: codes and scales."""
    qmax = 2 ** (bits - 1) - 1
    rows, cols = w.shape
    g = group or cols
    groups = w.reshape(rows, cols // g, g)
    scale = groups.abs().amax(dim=2, keepdim=True) / qmax
    codes = torch.clamp(torch.round(groups / scale), -qmax, qmax)
    return codes.reshape(rows, cols), scale.reshape(rows, -1)


def _linear(n_in: int, n_out: int, bias: bool, dtype=torch.float64) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias, dtype=dtype)
    with torch.no_grad():
        layer.weight.normal_()
        if bias:
            layer.bias.normal_()
    return layer


def _quantized(layer: nn.Linear, bits: int, group: int | None) -> HadamardQuantLinear:
    model = nn.Sequential(nn.Sequential(layer))  # the name "0.0" has a numeric part: the default filter takes it
    quantize_(model, QuantConfig(weights=WeightQuant("hadamard-rtn", bits=bits, group_size=group)))
    return model[0][0]


@pytest.mark.parametrize("n_in, group, bias", [(64, None, False), (48, None, True), (96, 32, False), (40, 8, True)])
def test_codes_and_outputs_match_a_float64_reference(n_in, group, bias):
    torch.manual_seed(n_in)
    layer = _linear(n_in, 24, bias)
    q = _quantized(layer, 4, group)
    assert isinstance(q, HadamardQuantLinear)
    h = reference_rotation(q.signs)
    assert torch.allclose(h @ h.T, torch.eye(n_in, dtype=torch.float64), atol=1e-12)  # orthonormal
    codes, scale = reference_codes(layer.weight.detach() @ h, 4, group)
    assert torch.equal(q.codes().to(torch.float64), codes)  # exact codes
    assert torch.allclose(q.scale, scale, rtol=1e-14, atol=0)
    x = torch.randn(5, 7, n_in, dtype=torch.float64)
    expected = (x @ h) @ (codes * scale.repeat_interleave(group or n_in, dim=1)).T
    if bias:
        expected = expected + layer.bias.detach()
    with torch.no_grad():
        assert torch.allclose(q(x), expected, rtol=1e-10, atol=1e-10)


def test_the_rotation_alone_keeps_the_layer_function():
    """Rotating the input and the weight by the same H is exact: the unquantized product is unchanged."""
    torch.manual_seed(1)
    layer = _linear(64, 16, bias=True)
    q = _quantized(layer, 8, None)
    x = torch.randn(3, 64, dtype=torch.float64)
    w = layer.weight.detach()
    assert torch.allclose(q.rotate(x) @ q.rotate(w).T, x @ w.T, rtol=1e-12, atol=1e-12)


def test_sqnr_gain_over_rtn_on_outlier_columns():
    """A few large input columns dominate each row's absmax under RTN; the rotation spreads them out."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(128, 256, generator=gen, dtype=torch.float64)
    w[:, torch.randperm(256, generator=gen)[:4]] *= 40.0
    layer = nn.Linear(256, 128, bias=False, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(w)
    q = _quantized(layer, 4, None)
    h = reference_rotation(q.signs)
    rotated_back = q.dequantized_weight(torch.float64) @ h.T  # the weight the layer effectively applies
    codes, scale, _ = rtn_codes(w, 4)
    plain = codes.to(torch.float64) * scale
    gain = sqnr(w, rotated_back) - sqnr(w, plain)
    assert gain > 6.0, f"Hadamard-rotated RTN gains only {gain:.2f} dB over RTN"


def test_packed_round_trip_and_refused_exports(tmp_path):
    torch.manual_seed(3)
    model = randomize_(build_model(tiny_config("transformer")))
    q = quantize(model, QuantConfig(weights=WeightQuant("hadamard-rtn", bits=8, group_size=16))).eval()
    assert any(isinstance(m, HadamardQuantLinear) for m in q.modules())
    ids = torch.randint(0, 101, (2, 19))
    with torch.no_grad():
        rel = (q(ids) - model(ids)).norm() / model(ids).norm()
    assert 0 < rel < 0.05  # quantized, and still the same function up to 8-bit noise
    save_quantized(q, tmp_path / "q")
    loaded = load_quantized(tmp_path / "q")
    with torch.no_grad():
        assert torch.equal(loaded(ids), q(ids))
    for export in (lambda: save_gguf(q, tmp_path / "m.gguf"), lambda: save_compressed(q, tmp_path / "ct")):
        with pytest.raises(CheckpointError) as err:
            export()
        assert "hadamard-rtn" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "ct").exists()


def test_registered_as_a_plain_weight_method():
    method = weight_method("hadamard-rtn")
    assert not method.needs_calibration and method.exports == frozenset()
    with pytest.raises(ValueError, match="needs bits"):
        WeightQuant("hadamard-rtn")
