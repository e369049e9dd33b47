"""GPTQ's "full" symmetric grid (against an independent float64 reference) and the block-cached driver."""

import copy

import pytest
import torch
from torch import nn

from diffquant import build_model
from diffquant.quant import QuantConfig, QuantLinear, WeightQuant, gptq_codes, quantize_model, rtn_codes
from diffquant.quant import gptq as gptq_module
from diffquant.quant.numerics import dequantize
from tests.conftest import tiny_config
from tests.helpers import correlated_inputs, gptq_reference_start, hessian, randomize_


def naive_full_grid_gptq(W, H, bits, group_size=None, act_order=False, damp=0.01):
    """GPTQ on the grid {-2**(b-1), ..., 2**(b-1)-1}·s, s = 2·amax/(2**b-1): column by column, explicit inverse
    Hessian with its Schur-complement downdate, float64. Returns codes in 0..2**b-1 (zero point 2**(b-1)) and
    the ratios w/s that were rounded."""
    W, Hinv, order = gptq_reference_start(W, H, act_order, damp)
    rows, cols = W.shape
    gs, zero, top = group_size or cols, 2 ** (bits - 1), 2**bits - 1
    scales, codes, ratios = {}, torch.zeros(rows, cols, dtype=torch.float64), torch.zeros(rows, cols, dtype=W.dtype)
    for i in range(cols):
        g = int(order[i]) // gs
        if g not in scales:
            members = [j for j in range(cols) if int(order[j]) // gs == g]
            scales[g] = 2 * W[:, members].abs().amax(1) / top
        s = scales[g]
        ratios[:, i] = W[:, i] / s
        q = (torch.round(ratios[:, i]) + zero).clamp(0, top)
        codes[:, i] = q
        err = (W[:, i] - (q - zero) * s) / Hinv[i, i]
        W[:, i + 1:] -= err[:, None] * Hinv[i, i + 1:][None, :]
        Hinv = Hinv - torch.outer(Hinv[:, i], Hinv[i, :]) / Hinv[i, i]
    back = torch.argsort(order)
    return codes[:, back], ratios[:, back]


@pytest.mark.parametrize("group_size, act_order", [(None, False), (8, False), (None, True), (8, True)])
def test_full_grid_matches_the_unblocked_reference(group_size, act_order):
    W = torch.randn(12, 32, dtype=torch.float64)
    X = correlated_inputs(256, 32)
    X[:, 7] = 0  # a dead input
    H = hessian(X)
    expected, ratios = naive_full_grid_gptq(W, H, 4, group_size, act_order)
    # A group's largest |w| can sit exactly on a rounding tie (w/s = -7.5 when its column opens the group): the
    # last bits of the updated weights, which blocking changes, then pick -8 or -7 (equal error), and the row's
    # later updates follow. Rows are independent in GPTQ: every row without such a tie must match exactly.
    clean = ~((ratios + 7.5).abs() < 1e-9).any(dim=1)
    assert clean.sum() >= W.shape[0] // 2
    for block in (8, 32) if not act_order else (32,):
        codes, scale, zero = gptq_codes(W, H, 4, group_size, act_order=act_order, block_size=block, grid="full")
        assert torch.equal(codes.double()[clean], expected[clean]), f"block {block}"
        assert torch.all(zero == 8) and codes.min() >= 0 and codes.max() <= 15


def test_full_grid_rtn_uses_all_levels_with_a_finer_step():
    W = torch.randn(16, 40, dtype=torch.float64)
    codes, scale, zero = rtn_codes(W, 4, group_size=8, grid="full")
    groups = W.reshape(16, 5, 8)
    s = 2 * groups.abs().amax(-1) / 15
    expected = (torch.round(groups / s[..., None]) + 8).clamp(0, 15).reshape(16, 40)
    assert torch.equal(codes.double(), expected) and torch.equal(scale, s) and torch.all(zero == 8)
    assert codes.min() == 0 or codes.max() == 15  # the extra level is reachable
    absmax_scale = rtn_codes(W, 4, group_size=8)[1]
    torch.testing.assert_close(scale, absmax_scale * 14 / 15)
    w_hat = dequantize(codes, scale, zero)
    assert torch.all((w_hat - W).abs().reshape(16, 5, 8) <= scale[..., None] * (0.5 + 1e-12) * 15 / 14 + 1e-12)


def test_the_grid_defaults_to_gptqs_own_for_gptq_and_absmax_elsewhere():
    assert WeightQuant("gptq", bits=4).grid == "full" and WeightQuant("rtn", bits=4).grid == "absmax"
    assert WeightQuant("gptq", bits=4, symmetric=False).grid == "absmax"
    assert WeightQuant.from_dict(WeightQuant("gptq", bits=4, grid="absmax").to_dict()).grid == "absmax"


def test_full_grid_settings_are_validated():
    with pytest.raises(ValueError, match="grid"):
        WeightQuant("gptq", bits=4, grid="full", symmetric=False)
    with pytest.raises(ValueError, match="grid"):
        WeightQuant("rtn", bits=4, grid="nf4")
    with pytest.raises(ValueError, match="grid"):
        WeightQuant("bnb-nf4", grid="full")
    with pytest.raises(ValueError, match="grid"):
        rtn_codes(torch.randn(4, 8), 4, grid="full", symmetric=False)


def linear_names(model):
    return [n for n, m in model.named_modules() if type(m) is nn.Linear and "layers" in n]


@pytest.mark.parametrize("grid", ["absmax", "full"])
def test_block_cached_driver_equals_whole_model_forwards(arch, grid, monkeypatch):
    model = randomize_(build_model(tiny_config(arch))).eval()
    calib = list(torch.randint(0, 101, (12, 10)).split(4))
    fast, slow = copy.deepcopy(model), copy.deepcopy(model)
    gptq_module.gptq_quantize_(fast, linear_names(model), calib, 3, grid=grid)
    monkeypatch.setattr(gptq_module, "_blocks", lambda *a: None)  # the generic path: a model forward per stage
    gptq_module.gptq_quantize_(slow, linear_names(model), calib, 3, grid=grid)
    for name in linear_names(model):
        a, b = fast.get_submodule(name), slow.get_submodule(name)
        assert isinstance(a, QuantLinear) and torch.equal(a.qweight, b.qweight) and torch.equal(a.scale, b.scale)
    assert fast.config.attn_impl == model.config.attn_impl  # calibration's sdpa switch is undone


def test_blocks_are_found_only_inside_one_module_list():
    model = build_model(tiny_config())
    blocks = gptq_module._blocks(model, ["layers.1.attn.q_proj", "layers.1.mlp.down_proj"])
    assert [(p, names) for p, _, names in blocks] == [("layers.1", ["attn.q_proj", "mlp.down_proj"])]
    assert gptq_module._blocks(model, ["layers.0.attn.q_proj", "head"]) is None
    assert gptq_module._blocks(nn.Sequential(nn.ModuleList([nn.Linear(2, 2)])), ["0.0"]) is None


def test_parallel_stages_use_the_float_blocks_inputs(monkeypatch):
    model = randomize_(build_model(tiny_config())).eval()
    calib = torch.randint(0, 101, (8, 10))
    seen = []
    real = gptq_module.gptq_codes
    monkeypatch.setattr(gptq_module, "gptq_codes", lambda w, H, *a, **k: seen.append(H.clone()) or real(w, H, *a, **k))
    quantize_model(model, QuantConfig(weights=WeightQuant("gptq", bits=3, sequential=False)), calib=calib)
    acc = gptq_module.HessianAccumulator(model.layers[0].attn.out_proj.in_features)
    h = model.layers[0].attn.out_proj.register_forward_pre_hook(lambda mod, args: acc.add(args[0]))
    with torch.no_grad():
        model.set_attn_impl("sdpa")(calib)
    h.remove()
    torch.testing.assert_close(seen[3], acc.hessian())  # out_proj of block 0 saw the float q/k/v's output
