"""The fused Differential-attention forward (Triton, interpreted on the CPU) against a float64 reference and the
model's own attention module."""

import pytest
import torch

pytest.importorskip("triton")

from diffquant import ModelConfig, build_model  # noqa: E402
from diffquant.kernels.diff_attention import diff_attention_forward  # noqa: E402  (interpreted: see conftest)
from diffquant.model import apply_rope, rope_cos_sin  # noqa: E402

from ..conftest import tiny_config  # noqa: E402
from .conftest import DEVICE  # noqa: E402


def reference(q, k, v, lam, w, lambda_init, eps=1e-5):
    """Float64, straight from the paper's formula: RMSNorm((A1 − λ A2) V) · w · (1 − λ_init)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H2, T, d = q.shape
    H, K = H2 // 2, k.shape[1] // 2
    S = k.shape[2]
    keep = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    outs = []
    for h in range(H):
        g = h // (H // K)
        maps = []
        for j in range(2):
            s = (q[:, 2 * h + j] * d ** -0.5) @ k[:, 2 * g + j].transpose(-1, -2)
            maps.append(torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1))
        o = (maps[0] - float(lam) * maps[1]) @ v[:, g]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
        outs.append(o * w.double() * (1 - lambda_init))
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("H,K,T,d", [(2, 2, 20, 8), (4, 2, 33, 16)])
def test_fused_forward_equals_the_float64_formula(H, K, T, d):
    gen = torch.Generator().manual_seed(T)
    q, k = torch.randn(2, 2 * H, T, d, generator=gen), torch.randn(2, 2 * K, T, d, generator=gen)
    v = torch.randn(2, K, T, 2 * d, generator=gen)
    lam, w = torch.tensor(0.37), 1 + 0.1 * torch.randn(2 * d, generator=gen)
    got = diff_attention_forward(*(t.to(DEVICE) for t in (q, k, v, lam, w)), 0.2, block=(16, 16)).cpu()
    want = reference(q, k, v, lam, w, 0.2)
    assert got.shape == (2, H, T, 2 * d)
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("preset,T,S", [("xs", 96, 96), ("xs", 24, 90), ("small", 80, 80)])
def test_default_launch_at_the_presets_shapes_equals_the_float64_formula(preset, T, S):
    """Heads, kv groups and head width of the preset's Diff model (xs: grouped queries, d 8; small: d 32), the
    default tiles, partial tiles, and queries after cached keys (T < S)."""
    cfg = ModelConfig.preset(preset, arch="diff")
    H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    gen = torch.Generator().manual_seed(S)
    q, k = torch.randn(2, 2 * H, T, d, generator=gen), torch.randn(2, 2 * K, S, d, generator=gen)
    v = torch.randn(2, K, S, 2 * d, generator=gen)
    lam, w = torch.rand((), generator=gen), 1 + 0.1 * torch.randn(2 * d, generator=gen)
    got = diff_attention_forward(*(t.to(DEVICE) for t in (q, k, v, lam, w)), cfg.lambda_init_at(3)).cpu()
    want = reference(q, k, v, lam, w, cfg.lambda_init_at(3))
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_lambda_from_the_layer_vectors_equals_lambda_given():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 20, 8, generator=gen), torch.randn(1, 4, 20, 8, generator=gen)
    v = torch.randn(1, 2, 20, 16, generator=gen)
    vectors, w = 0.4 * torch.randn(4, 8, generator=gen, dtype=torch.float64), torch.ones(16)
    lam = (vectors[0] @ vectors[1]).exp() - (vectors[2] @ vectors[3]).exp() + 0.7
    got = diff_attention_forward(*(t.to(DEVICE) for t in (q, k, v)), tuple(vectors.float().to(DEVICE)), w.to(DEVICE),
                                 0.7, block=(16, 16)).cpu()
    torch.testing.assert_close(got.double(), reference(q, k, v, lam, w, 0.7), rtol=1e-4, atol=1e-5)


def test_fused_forward_reproduces_the_model_attention():
    model = build_model(tiny_config("diff", n_kv_heads=2), seed=1).eval()
    attn, cfg = model.layers[1].attn, model.config
    B, T = 2, 24
    x = torch.randn(B, T, cfg.d_model)
    cos, sin = rope_cos_sin(T, cfg.head_dim, cfg.rope_theta)
    with torch.no_grad():
        want = attn(x, cos, sin)
        d = attn.head_dim
        q = apply_rope(attn.q_proj(x).view(B, T, -1, d).transpose(1, 2), cos, sin)
        k = apply_rope(attn.k_proj(x).view(B, T, -1, d).transpose(1, 2), cos, sin)
        v = attn.v_proj(x).view(B, T, attn.n_kv, 2 * d).transpose(1, 2)
        out = diff_attention_forward(*(t.to(DEVICE) for t in (q, k, v, attn.lambda_full(), attn.subln.weight)),
                                     attn.lambda_init, block=(16, 16)).cpu()
        got = attn.out_proj(out.transpose(1, 2).reshape(B, T, -1))
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [32, 64])  # the small and base presets' head widths (4 and 8 warps)
def test_16_bit_forward_on_cuda(dtype, d):
    gen = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, 8, 256, d, generator=gen), torch.randn(2, 8, 256, d, generator=gen)
    v, w = torch.randn(2, 4, 256, 2 * d, generator=gen), 1 + 0.1 * torch.randn(2 * d, generator=gen)
    got = diff_attention_forward(*(t.cuda().to(dtype) for t in (q, k, v)), torch.tensor(0.3).cuda(), w.cuda(), 0.2)
    want = reference(*(t.to(dtype).float() for t in (q, k, v)), 0.3, w, 0.2)
    assert torch.allclose(got.cpu().double(), want, rtol=3e-2, atol=3e-2)
