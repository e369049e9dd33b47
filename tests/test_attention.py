"""One way to switch the attention implementation: attention_impl restores every module, also on errors."""

import pytest
import torch

from diffquant import build_model
from diffquant.attention import attention_impl, diff_kernel_wanted, switchable
from diffquant.model import FUSED_KERNELS
from diffquant.quant import QuantConfig, WeightQuant, quantize
from tests.conftest import tiny_config


def _settings(model):
    return [(m.impl, m.chunk) for m in switchable(model)]


def test_switch_and_restore_also_on_errors(arch):
    model = build_model(tiny_config(arch, attn_impl="sdpa")).eval()
    model.set_attn_impl("sdpa", chunk=None)
    ids = torch.randint(0, 101, (2, 11))
    with torch.no_grad():
        fused = model(ids)
        with attention_impl(model, "eager", chunk=4) as saved:
            assert _settings(model) == [("eager", 4)] * len(saved) == [("eager", 4)] * model.config.n_layers
            torch.testing.assert_close(model(ids), fused, rtol=1e-5, atol=1e-5)
        assert _settings(model) == [("sdpa", None)] * model.config.n_layers
        with pytest.raises(RuntimeError, match="boom"), attention_impl(model, "eager"):
            assert _settings(model) == [("eager", None)] * model.config.n_layers  # chunk kept
            raise RuntimeError("boom")
    assert _settings(model) == [("sdpa", None)] * model.config.n_layers
    assert model.config.attn_impl == "sdpa"  # the config says how the model runs outside the block


def test_gptq_calibrates_through_it_and_leaves_an_eager_model_eager():
    model = build_model(tiny_config("diff")).eval()
    model.set_attn_impl("eager", chunk=8)
    q = quantize(model, QuantConfig(weights=WeightQuant("gptq", bits=4)), calib=torch.randint(0, 101, (4, 12)))
    assert _settings(q) == [("eager", 8)] * q.config.n_layers
    assert set(FUSED_KERNELS) == {"sdpa", "flash", "triton"}


@pytest.mark.parametrize("impl,device,auto,wanted", [
    ("triton", "cuda", True, True), ("triton", "cpu", False, True), ("sdpa", "cuda", True, True),
    ("sdpa", "cuda", False, False), ("sdpa", "cpu", True, False), ("eager", "cuda", True, False),
    ("flash", "cuda", True, False), ("triton", "mps", True, False)])
def test_which_impls_ask_for_the_fused_diff_kernel(impl, device, auto, wanted):
    assert diff_kernel_wanted(impl, device, auto) is wanted
