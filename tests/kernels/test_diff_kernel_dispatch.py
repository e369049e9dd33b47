"""The fused Diff kernel inside the model: which calls take it (attn_impl "triton"; "sdpa" on CUDA), that the model
then gives the float64 eager model's outputs, and that every other call runs the sdpa path unchanged."""

import copy

import pytest
import torch

pytest.importorskip("triton")

from diffquant import ModelConfig, build_model, kernels  # noqa: E402
from diffquant.attention import auto_diff_kernel  # noqa: E402
from diffquant.kernels import diff_attention  # noqa: E402  (interpreted: see conftest)
from diffquant.model import KVCache  # noqa: E402
from diffquant.probes import hooked  # noqa: E402

from .conftest import DEVICE  # noqa: E402


@pytest.fixture
def kernel_calls(monkeypatch):
    """The (B, 2H, T, d) shape of q of every call into the kernel (its self-check launches it directly)."""
    calls = []
    real = diff_attention.diff_attention_forward

    def counting(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(diff_attention, "diff_attention_forward", counting)
    return calls


def preset_model(preset: str, impl: str, arch: str = "diff", **overrides):
    """The preset's model with a short context (the interpreter is slow), λ and the head norm's weight moved off
    their initial values so that both enter the result."""
    cfg = ModelConfig.preset(preset, arch=arch, max_seq_len=48, attn_impl=impl, **overrides)
    model = build_model(cfg, seed=3).eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lambda" in name or "subln" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model.to(DEVICE)


def float64_eager(model):
    return copy.deepcopy(model).double().set_attn_impl("eager")


@pytest.mark.parametrize("preset", ["xs", "small"])  # xs: grouped queries, head width 8; small: 32
def test_triton_model_equals_the_float64_eager_model(preset, kernel_calls):
    model = preset_model(preset, "triton")
    ids = torch.randint(0, model.config.vocab_size, (2, 40), device=DEVICE)
    with torch.no_grad():
        got, want = model(ids), float64_eager(model)(ids)
        with auto_diff_kernel(False):
            sdpa = model.set_attn_impl("sdpa")(ids)  # torch's sdpa alone
    assert len(kernel_calls) == model.config.n_layers  # every layer ran the kernel, once
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    assert (got.double() - want).abs().max() <= 4 * (sdpa.double() - want).abs().max() + 1e-6


def test_decoding_with_a_cache_runs_the_kernel_with_the_queries_last(kernel_calls):
    model = preset_model("xs", "triton", n_layers=2)
    ids = torch.randint(0, model.config.vocab_size, (2, 26), device=DEVICE)
    cache = KVCache(model.config, 2, device=DEVICE)
    with torch.no_grad():
        steps = [model(ids[:, :20], cache), model(ids[:, 20:], cache)]
        want = float64_eager(model)(ids)
    assert [shape[2] for shape in kernel_calls] == [20, 20, 6, 6]
    torch.testing.assert_close(torch.cat(steps, dim=1).double(), want, rtol=1e-4, atol=1e-4)


def test_training_takes_the_sdpa_path(kernel_calls):
    """The kernel has no backward: with a gradient needed the call runs sdpa, and gradients flow."""
    model = preset_model("xs", "triton").train()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), device=DEVICE)
    out = model(ids)
    out.square().mean().backward()
    assert kernel_calls == []
    assert all(p.grad is not None for n, p in model.named_parameters() if "lambda" in n or "subln" in n)
    with torch.no_grad(), auto_diff_kernel(False):
        torch.testing.assert_close(out, model.set_attn_impl("sdpa")(ids), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["no triton", "self-check failed", "float64", "sdpa off CUDA", "transformer",
                                  "attention maps probed"])
def test_fallbacks_run_the_sdpa_path(case, monkeypatch, kernel_calls):
    arch = "transformer" if case == "transformer" else "diff"
    model = preset_model("xs", "sdpa" if case == "sdpa off CUDA" else "triton", arch=arch)
    if case == "no triton":
        monkeypatch.setattr(kernels, "available", lambda: False)
    if case == "self-check failed":
        device = torch.zeros(0, device=DEVICE).device  # with its index on CUDA, as the model's tensors
        monkeypatch.setitem(diff_attention._CHECKED, (str(device), torch.float32, 8), False)
    if case == "float64":  # e.g. the float64 sampling teacher
        model.double()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), device=DEVICE)
    seen = []
    with torch.no_grad():
        if case == "attention maps probed":
            with hooked(model, lambda name, probe, x, call: seen.append(name), kinds=("attn_logits",)):
                got = model(ids)
            assert len(seen) == model.config.n_layers
        else:
            got = model(ids)
        with auto_diff_kernel(False):
            want = model.set_attn_impl("eager" if case == "attention maps probed" else "sdpa")(ids)
    if case == "sdpa off CUDA" and DEVICE == "cuda":
        pytest.skip("on CUDA sdpa takes the kernel")
    assert kernel_calls == []
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_auto_switch_is_restored_and_sdpa_on_cuda_takes_the_kernel(kernel_calls):
    model = preset_model("xs", "sdpa")
    ids = torch.randint(0, model.config.vocab_size, (2, 16), device=DEVICE)
    with torch.no_grad():
        with auto_diff_kernel(False):
            model(ids)
        assert kernel_calls == []
        model(ids)
    assert len(kernel_calls) == (model.config.n_layers if DEVICE == "cuda" else 0)


def test_supports_only_inputs_the_kernel_takes():
    q, k, v = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 16)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    assert diff_attention.supports(q, k, v)
    assert diff_attention.supports(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert not diff_attention.supports(q.double(), k.double(), v.double())
    assert not diff_attention.supports(q.bfloat16(), k, v)  # e.g. a float32 cache under bf16 autocast
    assert not diff_attention.supports(q, k, v[..., :8])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_inference_on_cuda_takes_the_kernel_and_is_as_close_as_sdpa(kernel_calls):
    """What perf_gpu.py times: bf16 autocast, attn_impl "sdpa", the kernel taken automatically."""
    model = preset_model("small", "sdpa")
    ids = torch.randint(0, model.config.vocab_size, (4, 48), device=DEVICE)
    with torch.no_grad():
        want = float64_eager(model)(ids)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = model(ids).double()
            with auto_diff_kernel(False):
                sdpa = model(ids).double()
    assert len(kernel_calls) == model.config.n_layers
    assert (got - want).abs().max() <= 1.5 * (sdpa - want).abs().max() + 1e-3
