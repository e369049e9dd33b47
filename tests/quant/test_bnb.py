"""bitsandbytes adapter on CPU (skipped cleanly when bitsandbytes is missing) and its missing-extra message."""

import sys

import pytest
import torch

from diffquant import build_model
from diffquant.checkpoint import load_quantized, save_quantized
from diffquant.quant import QuantConfig, WeightQuant, quantize_model
from tests.conftest import tiny_config

METHODS = ["bnb-int8", "bnb-nf4", "bnb-fp4"]


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture
def bnb():
    return pytest.importorskip("bitsandbytes")


@pytest.mark.parametrize("method", METHODS)
def test_bnb_layers_run_on_cpu_close_to_float(bnb, method, tmp_path):
    model = build_model(tiny_config(d_model=64, n_heads=4)).eval()  # 4-bit blocks of 64 need 64-wide rows
    ids = torch.randint(0, 101, (2, 12))
    q = quantize_model(model, QuantConfig(weights=WeightQuant(method)))
    kinds = {type(m).__name__ for n, m in q.named_modules() if n.endswith("q_proj")}
    assert kinds == {"Linear8bitLt" if method == "bnb-int8" else "Linear4bit"}
    with torch.no_grad():
        ref, out = model(ids), q(ids)
        err = rel_err(out, ref)
        assert torch.equal(q(ids), out)  # no drift between calls (CPU repacking switched off)
    assert 0 < err < (0.01 if method == "bnb-int8" else 0.1), err
    save_quantized(q, tmp_path / method)
    with torch.no_grad():
        assert torch.equal(load_quantized(tmp_path / method)(ids), out)


def test_int8_threshold_is_recorded(bnb):
    q = quantize_model(build_model(tiny_config()), QuantConfig(weights=WeightQuant("bnb-int8", threshold=3.0)))
    assert q.layers[0].mlp.up_proj.state.threshold == 3.0


def test_a_missing_bitsandbytes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # makes `import bitsandbytes` fail
    with pytest.raises(RuntimeError) as excinfo:
        quantize_model(build_model(tiny_config()), QuantConfig(weights=WeightQuant("bnb-nf4")))
    message = str(excinfo.value)
    assert "pip install 'diffquant[bnb]'" in message and "\n" not in message


def test_an_fp16_save_keeps_the_bitsandbytes_statistics(bnb, tmp_path):
    model = build_model(tiny_config(d_model=64, n_heads=4))
    for method in ("bnb-int8", "bnb-nf4"):
        q = quantize_model(model, QuantConfig(weights=WeightQuant(method)))
        save_quantized(q, tmp_path / method, dtype=torch.float16)
        loaded = load_quantized(tmp_path / method)
        x = torch.randn(2, 5, 64)
        with torch.no_grad():
            assert torch.equal(loaded.layers[0].mlp.up_proj(x), q.layers[0].mlp.up_proj(x))
            assert loaded.norm.weight.dtype == torch.float32  # loaded back in the requested dtype
