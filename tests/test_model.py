"""The models against an independent float64 reference written from the paper's formulas."""

import math

import pytest
import torch

from diffquant import build_model, hooked, probes
from diffquant.errors import UserError

from .conftest import tiny_config
from .helpers import randomize_

# -- an independent reference: loops over heads, complex-number RoPE, written from the paper ---------------


def ref_rmsnorm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def ref_rope(x, theta):
    """x (T, d): rotate pairs (x[2j], x[2j+1]) as complex numbers by pos·θ^(-2j/d)."""
    T, d = x.shape
    z = torch.complex(x[:, 0::2], x[:, 1::2])
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = z * torch.polar(torch.ones(T, d // 2, dtype=torch.float64), torch.arange(T)[:, None] * freqs)
    return torch.stack([z.real, z.imag], dim=-1).reshape(T, d)


def ref_softmax_causal(scores):
    T = scores.shape[0]
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf)
    return torch.softmax(scores, dim=-1)


def ref_attention(p, cfg, x, layer):
    """One sequence x (T, D). Sub-head 2i = Q1 of head i, 2i+1 = Q2; kv head g serves heads g·n_rep..."""
    d, H, K = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    pre = f"layers.{layer}.attn."
    Q, Kx, V = x @ p[pre + "q_proj.weight"].T, x @ p[pre + "k_proj.weight"].T, x @ p[pre + "v_proj.weight"].T
    n_rep = H // K
    heads = []
    for i in range(H):
        g = i // n_rep
        if cfg.arch != "diff":
            q = ref_rope(Q[:, i * d:(i + 1) * d], cfg.rope_theta)
            k = ref_rope(Kx[:, g * d:(g + 1) * d], cfg.rope_theta)
            a = ref_softmax_causal(q @ k.T / math.sqrt(d))
            if cfg.arch == "clipped":  # Bondarenko et al.: clip((ζ − γ)·softmax + γ, 0, 1), ζ = 1, γ = −α/T
                gamma = -12.0 / cfg.max_seq_len
                a = torch.clamp((1 - gamma) * a + gamma, 0, 1)
            o = a @ V[:, g * d:(g + 1) * d]
            if cfg.arch == "gated":  # Qiu et al. G1: Y ⊙ σ(X W_θ), head i's slice of the gate
                o = o * torch.sigmoid(x @ p[pre + "gate_proj.weight"][i * d:(i + 1) * d].T)
            heads.append(o)
            continue
        q1, q2 = (ref_rope(Q[:, (2 * i + j) * d:(2 * i + j + 1) * d], cfg.rope_theta) for j in (0, 1))
        k1, k2 = (ref_rope(Kx[:, (2 * g + j) * d:(2 * g + j + 1) * d], cfg.rope_theta) for j in (0, 1))
        v = V[:, 2 * g * d:2 * (g + 1) * d]
        lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        lam = (torch.exp(p[pre + "lambda_q1"] @ p[pre + "lambda_k1"])
               - torch.exp(p[pre + "lambda_q2"] @ p[pre + "lambda_k2"]) + lam_init)
        a1 = ref_softmax_causal(q1 @ k1.T / math.sqrt(d))
        a2 = ref_softmax_causal(q2 @ k2.T / math.sqrt(d))
        o = (a1 - lam * a2) @ v
        heads.append(ref_rmsnorm(o, p[pre + "subln.weight"], 1e-5) * (1 - lam_init))
    return torch.cat(heads, dim=-1) @ p[pre + "out_proj.weight"].T


def ref_lm(p, cfg, ids):
    """Logits for one sequence of token ids (T,)."""
    x = p["embed.weight"][ids]
    for layer in range(cfg.n_layers):
        pre = f"layers.{layer}."
        x = x + ref_attention(p, cfg, ref_rmsnorm(x, p[pre + "attn_norm.weight"], cfg.norm_eps), layer)
        h = ref_rmsnorm(x, p[pre + "mlp_norm.weight"], cfg.norm_eps)
        gate, up = h @ p[pre + "mlp.gate_proj.weight"].T, h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    x = ref_rmsnorm(x, p["norm.weight"], cfg.norm_eps)
    return x @ p["head.weight"].T


@pytest.mark.parametrize("arch", ["transformer", "diff", "gated", "clipped"])
@pytest.mark.parametrize("kv", [None, 1, 2])
def test_matches_float64_reference(arch, kv):
    base = tiny_config("transformer", n_kv_heads=kv * 2 if kv else None)
    cfg = base.matched(arch)
    model = randomize_(build_model(cfg)).double().eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 23))
    params = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ours = model(ids)
        ref = torch.stack([ref_lm(params, cfg, ids[b]) for b in range(2)])
    assert (ours - ref).abs().max().item() <= 1e-10 * ref.abs().max().item()
    if arch == "diff":  # λ must be non-trivial for the test to mean something
        lam = model.layers[1].attn.lambda_full().item()
        assert abs(lam - model.layers[1].attn.lambda_init) > 1e-3


@pytest.mark.parametrize("kv", [None, 2])
def test_eager_sdpa_and_chunked_eager_agree(arch, kv):
    cfg = tiny_config("transformer", n_kv_heads=kv).matched(arch)
    model = randomize_(build_model(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 40))
    with torch.no_grad():
        eager = model.set_attn_impl("eager")(ids)
        sdpa = model.set_attn_impl("sdpa")(ids)
        chunked = model.set_attn_impl("eager", chunk=7)(ids)
    scale = eager.abs().max()
    assert (eager - sdpa).abs().max() <= 1e-5 * scale
    assert (eager - chunked).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_causality(arch, impl):
    cfg = tiny_config(arch, attn_impl=impl)
    model = randomize_(build_model(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 30))
    changed = ids.clone()
    t = 17
    changed[:, t + 1:] = torch.randint(0, cfg.vocab_size, (2, 30 - t - 1))
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[:, :t + 1], b[:, :t + 1])
    assert not torch.equal(a[:, t + 1:], b[:, t + 1:])


def test_lambda_init_per_layer():
    model = build_model(tiny_config("diff", n_layers=3))
    got = [block.attn.lambda_init for block in model.layers]
    assert got == pytest.approx([0.2, 0.35550907, 0.47071302], abs=1e-8)
    lam_std = torch.cat([model.layers[0].attn.lambda_q1, model.layers[1].attn.lambda_q1]).std()
    assert 0.03 < lam_std < 0.3  # drawn from N(0, 0.1)


def test_probe_names_and_shapes(arch):
    cfg = tiny_config(arch, n_kv_heads=2)
    model = build_model(cfg)
    B, T, H, d = 2, 9, cfg.n_heads, cfg.head_dim
    seen = {}
    with hooked(model, lambda name, probe, x, call: seen.__setitem__(name, tuple(x.shape))):
        model(torch.randint(0, cfg.vocab_size, (B, T)))
    s = 2 if arch == "diff" else 1
    maps = (B, H, 2, T, T) if arch == "diff" else (B, H, T, T)
    expected = {
        "layers.1.attn.q": (B, H * s, T, d), "layers.1.attn.k": (B, cfg.n_kv_heads * s, T, d),
        "layers.1.attn.logits": maps, "layers.1.attn.probs": maps,
        "layers.1.mlp.act": (B, T, cfg.ffn_dim), "layers.1.out": (B, T, cfg.d_model),
    }
    if arch == "diff":
        expected["layers.1.attn.diff"] = (B, H, T, T)
    for name, shape in expected.items():
        assert seen[name] == shape, name
    assert set(seen) == set(probes(model))
    kinds = {name: p.kind for name, p in probes(model).items()}
    assert kinds["layers.0.attn.logits"] == "attn_logits" and kinds["layers.0.out"] == "hidden"


def test_sdpa_path_fires_no_logit_probes(arch):
    """The fused path never materialises the maps (hooked() therefore runs eager for them: tests/test_hooked.py)."""
    model = build_model(tiny_config(arch, attn_impl="sdpa"))
    seen = []
    handles = [p.register_forward_hook(lambda m, a, out, name=name: seen.append(name))
               for name, p in probes(model).items()]
    try:
        model(torch.randint(0, 50, (1, 5)))
    finally:
        for h in handles:
            h.remove()
    assert seen and not any("logits" in n or "probs" in n for n in seen)


def test_hooks_are_removed_when_the_body_raises(tiny):
    model = build_model(tiny)
    ids = torch.randint(0, tiny.vocab_size, (1, 6))
    calls = []
    with pytest.raises(KeyError), hooked(model, lambda *a: calls.append(1)):
        model(ids)
        raise KeyError("boom")
    n = len(calls)
    model(ids)
    assert n > 0 and len(calls) == n
    assert all(not p._forward_hooks for p in probes(model).values())


def test_replacing_hook_changes_the_flow_and_sees_the_causal_mask(tiny):
    model = build_model(tiny).eval()
    ids = torch.randint(0, tiny.vocab_size, (2, 12))
    base = model(ids)

    def plant(name, probe, x, call):
        keep = probe.causal_mask(x, call.q_offset)
        return x.masked_fill(~keep, 1e9)  # values above the diagonal must never matter

    with hooked(model, plant, kinds="attn_logits"):
        same = model(ids)
    assert torch.equal(base, same)
    with hooked(model, lambda name, p, x, call: x * 0, kinds="attn_logits"):
        uniform = model(ids)
    assert not torch.allclose(base, uniform)


def test_chunked_probe_calls_carry_their_query_offset(tiny):
    model = build_model(tiny).set_attn_impl("eager", chunk=5)
    offsets = []
    with hooked(model, lambda n, p, x, call: offsets.append((call.q_offset, x.shape[-2], x.shape[-1])),
                select=lambda name, p: name == "layers.0.attn.logits"):
        model(torch.randint(0, tiny.vocab_size, (1, 12)))
    assert offsets == [(0, 5, 5), (5, 5, 10), (10, 2, 12)]


def test_bad_inputs_raise_one_line_errors(tiny):
    model = build_model(tiny)
    with pytest.raises(ValueError, match="outside 1..64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids must lie in"):
        model(torch.full((1, 4), tiny.vocab_size))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="unknown attn_impl"):
        model.set_attn_impl("fast")


def test_flash_without_flash_attn_is_a_clear_error(tiny):
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="pip install 'diffquant\\[gpu\\]'"):
            build_model(tiny_config("diff", attn_impl="flash"))
    else:
        pytest.skip("flash-attn is installed")


@pytest.mark.gpu
def test_flash_matches_eager_on_gpu(arch):
    pytest.importorskip("flash_attn")
    cfg = tiny_config(arch)
    model = randomize_(build_model(cfg)).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 40), device="cuda")
    with torch.no_grad():
        eager = model.set_attn_impl("eager")(ids).float()
        flash = model.set_attn_impl("flash")(ids).float()
    assert (eager - flash).abs().max() <= 2e-2 * eager.abs().max()


def test_seeded_builds_are_identical(tiny):
    a, b = build_model(tiny, seed=3), build_model(tiny, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("kv", [None, 2])
def test_kv_cache_decoding_equals_full_forward(arch, impl, kv):
    from diffquant.model import KVCache

    cfg = tiny_config("transformer", n_kv_heads=kv).matched(arch)
    model = randomize_(build_model(cfg)).set_attn_impl(impl).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 21))
    cache = KVCache(cfg, 3, 30)
    with torch.no_grad():
        full = model(ids)
        parts = [model(ids[:, :5], cache)] + [model(ids[:, t:t + 1], cache) for t in range(5, 21)]
    assert cache.length == 21
    stepwise = torch.cat(parts, dim=1)
    assert (full - stepwise).abs().max() <= 1e-5 * full.abs().max()
    with pytest.raises(ValueError, match="sequence length"):
        model(torch.zeros(3, 44, dtype=torch.long), cache)


@pytest.mark.parametrize("heads, kv_heads, value_width", [(8, 8, 8), (8, 4, 8), (16, 8, 16), (6, 2, 16)])
def test_a_decoding_step_matches_a_per_head_float64_reference(heads, kv_heads, value_width, monkeypatch):
    """One query that sees every cached key takes the two-matmul path on the CPU; it equals softmax(q·kᵀ)·v computed
    head by head, and the padded sdpa kernel it replaces."""
    from diffquant import model as model_module

    batch, keys, width = 3, 37, 8
    q = torch.randn(batch, heads, 1, width, dtype=torch.float64)
    k = torch.randn(batch, kv_heads, keys, width, dtype=torch.float64)
    v = torch.randn(batch, kv_heads, keys, value_width, dtype=torch.float64)
    scale = width ** -0.5
    reference = torch.stack([torch.softmax(q[:, h] @ k[:, h * kv_heads // heads].transpose(-1, -2) * scale, -1)
                             @ v[:, h * kv_heads // heads] for h in range(heads)], dim=1)
    calls, one_query = [], model_module._one_query
    monkeypatch.setattr(model_module, "_one_query", lambda *a: calls.append(1) or one_query(*a))
    out = model_module._sdpa(q, k, v, scale, keys - 1)
    assert calls and out.shape == (batch, heads, 1, value_width)
    assert (out - reference).abs().max() <= 1e-13 * reference.abs().max()
    kernel = model_module._sdpa_kernel(q, k, v, scale, keys - 1)
    assert (out - kernel).abs().max() <= 1e-13 * kernel.abs().max()
    model_module._sdpa(q, k[:, :, :-1], v[:, :, :-1], scale, keys - 3)  # a query that sees all but the last key
    assert len(calls) == 1


def test_dropping_rows_from_the_cache_keeps_the_others(tiny):
    from diffquant.model import KVCache

    model = randomize_(build_model(tiny)).set_attn_impl("sdpa").eval()
    ids = torch.randint(0, tiny.vocab_size, (4, 9))
    cache = KVCache(tiny, 4, 16)
    with torch.no_grad():
        model(ids[:, :8], cache)
        cache.select(torch.tensor([1, 3]))
        last = model(ids[[1, 3], 8:], cache)[:, -1]
        full = model(ids[[1, 3]])[:, -1]
    assert (last - full).abs().max() <= 1e-5 * full.abs().max()


def test_default_init_is_pytorchs_linear_init(arch):
    cfg = tiny_config(arch)
    default, normal = build_model(cfg, seed=0, init="default"), build_model(cfg, seed=0, init="normal")
    w = default.layers[0].attn.q_proj.weight.detach()
    bound = 1 / math.sqrt(cfg.d_model)  # kaiming_uniform(a=√5): U(-1/√fan_in, 1/√fan_in)
    assert w.abs().max() <= bound and w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    assert normal.layers[0].attn.q_proj.weight.detach().std().item() == pytest.approx(0.02, rel=0.1)
    assert default.embed.weight.detach().std().item() == pytest.approx(0.02, rel=0.1)
    with pytest.raises(ValueError, match="unknown init"):
        build_model(cfg, init="xavier")
