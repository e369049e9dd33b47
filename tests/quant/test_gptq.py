"""GPTQ: against an independent unblocked (OBS-style) reference, against RTN, and layer by layer in a model."""

import logging

import pytest
import torch
from torch import nn

from diffquant import build_model
from diffquant.quant import QuantConfig, QuantLinear, WeightQuant, gptq_codes, quantize_model, rtn_codes
from diffquant.quant import gptq as gptq_module
from diffquant.quant.numerics import code_range, dequantize
from tests.conftest import tiny_config
from tests.helpers import correlated_inputs, gptq_reference_start, hessian, randomize_


def naive_gptq(W, H, bits, group_size=None, symmetric=True, act_order=False, damp=0.01):
    """Column by column with the explicit inverse Hessian and its Schur-complement downdate (float64)."""
    W, Hinv, order = gptq_reference_start(W, H, act_order, damp)
    rows, cols = W.shape
    qmin, qmax = code_range(bits, symmetric)
    gs = group_size or cols
    params, codes = {}, torch.zeros(rows, cols, dtype=torch.float64)
    for i in range(cols):
        g = int(order[i]) // gs
        if g not in params:  # the group's current (updated) weights set its scale
            members = [j for j in range(cols) if int(order[j]) // gs == g]
            vals = W[:, members]
            if symmetric:
                params[g] = (vals.abs().amax(1) / qmax, None)
            else:
                lo, hi = vals.amin(1).clamp(max=0), vals.amax(1).clamp(min=0)
                s = (hi - lo) / qmax
                params[g] = (s, torch.round(-lo / s).clamp(0, qmax))
        s, z = params[g]
        q = torch.round(W[:, i] / s) + (0 if z is None else z)
        q = q.clamp(qmin, qmax)
        codes[:, i] = q
        err = (W[:, i] - (q - (0 if z is None else z)) * s) / Hinv[i, i]
        W[:, i + 1:] -= err[:, None] * Hinv[i, i + 1:][None, :]
        Hinv = Hinv - torch.outer(Hinv[:, i], Hinv[i, :]) / Hinv[i, i]
    return codes[:, torch.argsort(order)]


@pytest.mark.parametrize("group_size, symmetric, act_order", [(None, True, False), (8, True, False),
                                                               (8, False, True), (None, False, True)])
def test_matches_the_unblocked_reference(group_size, symmetric, act_order):
    W = torch.randn(12, 32, dtype=torch.float64)
    X = correlated_inputs(256, 32)
    X[:, 5] = 0  # a dead input
    H = hessian(X)
    expected = naive_gptq(W, H, 3, group_size, symmetric, act_order)
    # Block size 32 = all columns: with act_order, groups are scattered and need the whole matrix up to date.
    for block in (8, 32) if not act_order else (32,):
        codes, _, _ = gptq_codes(W, H, 3, group_size, symmetric, act_order, block_size=block)
        assert torch.equal(codes.double(), expected), f"block {block}"


@pytest.mark.parametrize("bits, group_size, act_order, block", [
    (3, None, False, 128), (4, None, True, 128), (3, 16, False, 128), (4, 16, True, 128), (2, 32, False, 128),
    (3, 16, False, 8), (4, 16, True, 8),  # lazy blocks narrower than the layer (and than a group)
])
def test_output_error_is_at_most_rtn_on_correlated_inputs(bits, group_size, act_order, block):
    W = torch.randn(48, 64)
    X = correlated_inputs(512, 64).float()
    codes, scale, zero = gptq_codes(W, hessian(X.double()), bits, group_size, act_order=act_order, block_size=block)
    r_codes, r_scale, r_zero = rtn_codes(W, bits, group_size)
    gptq_err = (X @ (W - dequantize(codes, scale, zero)).T).norm()
    rtn_err = (X @ (W - dequantize(r_codes, r_scale, r_zero)).T).norm()
    assert gptq_err < 0.8 * rtn_err, (gptq_err, rtn_err)


def test_dead_columns_get_zero_weight_and_the_result_stays_finite():
    W = torch.randn(6, 16)
    X = torch.randn(64, 16)
    X[:, [2, 9]] = 0
    codes, scale, _ = gptq_codes(W, hessian(X), 4, group_size=8)
    assert torch.all(codes[:, [2, 9]] == 0) and torch.isfinite(scale).all()


def test_bad_shapes_and_group_sizes_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        gptq_codes(torch.randn(4, 8), torch.eye(6), 4)



@pytest.mark.parametrize("grid", ["absmax", "full"])
def test_ragged_groups_with_an_identity_hessian_are_rtn(grid):
    """No error feedback through a diagonal Hessian: GPTQ's codes and scales are RTN's, ragged group included."""
    w = torch.randn(5, 11, dtype=torch.float64)  # groups of 4: 4 + 4 + 3
    codes, scale, zero = gptq_codes(w, torch.eye(11, dtype=torch.float64), 4, group_size=4, grid=grid)
    r_codes, r_scale, r_zero = rtn_codes(w, 4, 4, grid=grid)
    assert scale.shape == (5, 3) and torch.equal(codes, r_codes) and torch.equal(scale, r_scale)
    assert (zero is None and r_zero is None) or torch.equal(zero, r_zero)


def stage_names(model):
    return [n for n, m in model.named_modules() if type(m) is nn.Linear and "layers" in n]


def test_stages_follow_execution_order_grouping_shared_inputs(arch):
    model = build_model(tiny_config(arch)).eval()
    remaining = stage_names(model)
    calib = [torch.randint(0, 101, (2, 12))]
    stages = []
    while remaining:
        stage, hessians = gptq_module._calibrate_next_stage(model, remaining, calib)
        assert set(hessians) == set(stage) and all(h.count == 24 for h in hessians.values())
        stages.append([n.split(".", 2)[2] for n in stage])
        remaining = [n for n in remaining if n not in stage]
    block = [["attn.q_proj", "attn.k_proj", "attn.v_proj"], ["attn.out_proj"], ["mlp.gate_proj", "mlp.up_proj"],
             ["mlp.down_proj"]]
    assert stages == block * 2


def test_later_layers_are_calibrated_on_inputs_from_quantized_earlier_layers(arch, monkeypatch):
    model = randomize_(build_model(tiny_config(arch))).eval()
    calib = torch.randint(0, 101, (16, 12))
    seen = []
    real = gptq_module.gptq_codes
    monkeypatch.setattr(gptq_module, "gptq_codes", lambda w, H, *a, **k: seen.append(H.clone()) or real(w, H, *a, **k))
    q = quantize_model(model, QuantConfig(weights=WeightQuant("gptq", bits=3)), calib=calib)
    H_used = seen[7]  # layers.1.attn.q_proj: after the 7 Linear layers of block 0

    def input_hessian(m):  # calibration runs the fused kernel (eager gives the same within float rounding)
        m = m.set_attn_impl("sdpa")
        acc = gptq_module.HessianAccumulator(m.layers[1].attn.q_proj.in_features)
        h = m.layers[1].attn.q_proj.register_forward_pre_hook(lambda mod, args: acc.add(args[0]))
        with torch.no_grad():
            for batch in calib.split(8):
                m(batch)
        h.remove()
        return acc.hessian()

    torch.testing.assert_close(H_used, input_hessian(q))  # the quantized block 0 fed layer 1
    assert not torch.allclose(H_used, input_hessian(model), rtol=1e-3, atol=1e-6)


def test_gptq_model_beats_rtn_on_its_calibration_data(arch):
    model = randomize_(build_model(tiny_config(arch))).eval()
    calib = torch.randint(0, 101, (16, 16))
    with torch.no_grad():
        ref = model(calib)
        errs = {m: (quantize_model(model, QuantConfig(weights=WeightQuant(m, bits=3)), calib=calib)(calib) - ref)
                .norm().item() for m in ("rtn", "gptq")}
    assert errs["gptq"] < errs["rtn"], errs


class WithUnusedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])  # layers.1 never runs

    def forward(self, ids):
        return self.layers[0](self.embed(ids))


def test_layers_the_forward_never_reaches_fall_back_to_rtn(caplog):
    model = WithUnusedLayer()
    with caplog.at_level(logging.WARNING, logger="diffquant.quant"):
        q = quantize_model(model, QuantConfig(weights=WeightQuant("gptq", bits=4)), calib=torch.randint(0, 30, (4, 5)))
    assert isinstance(q.layers[0], QuantLinear) and isinstance(q.layers[1], QuantLinear)
    assert "round-to-nearest" in caplog.text


def test_gptq_without_calibration_data_is_refused():
    with pytest.raises(ValueError, match="calibration"):
        quantize_model(build_model(tiny_config()), QuantConfig(weights=WeightQuant("gptq", bits=4)))
