"""The Triton logit-statistics kernel (interpreted on the CPU) against the host profiler's reducers.

Inputs are dyadic (small integers times a power of two, scale d^-½ a power of two), so every tile product is exact
and equals torch's matmul whatever the summation order: top-k values, coordinates, counts, histogram and median
must then match bit for bit.
"""

import pytest
import torch

pytest.importorskip("triton")

from diffquant.kernels.logit_stats import logit_stats  # noqa: E402  (interpreted: see conftest)
from diffquant.stats import SiteStats, _unravel  # noqa: E402
from diffquant.stats_device import DeviceSiteStats  # noqa: E402

from .conftest import DEVICE  # noqa: E402


def dyadic(shape, gen, dtype):
    return (torch.randint(-6, 7, shape, generator=gen) * 0.5).to(dtype)


def eager_logits(q, k, n_heads, sub):
    """The model's eager path: (q·d^-½) kᵀ per head and map, (B, H, s, T, S) or (B, H, T, S) for one map."""
    B, _, T, d = q.shape
    K, S = k.shape[1] // sub, k.shape[2]
    qh = q.view(B, n_heads, sub, T, d)
    kh = k.view(B, K, sub, S, d).repeat_interleave(n_heads // K, dim=1)
    x = (qh * d ** -0.5) @ kh.transpose(-1, -2)
    return x if sub > 1 else x.squeeze(2)


def causal(t, s):
    return torch.ones(t, s, dtype=torch.bool).tril(s - t)


def run_both(seed, B, n_heads, n_kv, sub, T, d, topk, dtype, block=(16, 16)):
    gen = torch.Generator().manual_seed(seed)
    q, k = dyadic((B, n_heads * sub, T, d), gen, dtype), dyadic((B, n_kv * sub, T, d), gen, dtype)
    ref = SiteStats(topk)
    x = eager_logits(q, k, n_heads, sub)
    ref.update(x, causal(T, T), tag=3)
    summary = logit_stats(q.to(DEVICE), k.to(DEVICE), n_heads, sub, topk, dtype, block=block)
    assert summary.shape == tuple(x.shape)
    got = DeviceSiteStats(topk)
    got.absorb_logits(summary, tag=3)
    return got.host(), ref, summary, x


@pytest.mark.parametrize("sub,n_kv,d,T,topk", [(2, 2, 4, 20, 25), (1, 2, 16, 19, 1), (2, 1, 16, 33, 5000),
                                                (2, 2, 16, 17, 7)])
def test_kernel_equals_the_host_profiler(sub, n_kv, d, T, topk):
    host, ref, summary, x = run_both(sub * 100 + T, 2, 4, n_kv, sub, T, d, topk, torch.float32)
    got, want = host.result(), ref.result()
    assert got["top"] == want["top"] and got["top_coords"] == want["top_coords"]
    assert got["top_tags"] == want["top_tags"] and got["count"] == want["count"]
    assert host.hist.state_dict() == ref.hist.state_dict() and got["quantiles"] == want["quantiles"]
    assert got["median"] == want["median"] == x[causal(T, T).expand_as(x)].abs().median().item()
    assert got["mean_abs"] == pytest.approx(want["mean_abs"], rel=1e-6) and got["max"] == want["max"]
    assert not bool(summary.overflow)


def test_bfloat16_logits_bin_by_pattern_exactly():
    host, ref, _, _ = run_both(7, 1, 2, 2, 2, 24, 16, 30, torch.bfloat16)
    assert host.result() == ref.result() and ref.hist.exact


def test_top_coordinates_point_at_the_logits():
    host, _, _, x = run_both(11, 2, 4, 2, 2, 18, 4, 40, torch.float32)
    top = host.topk
    for value, coords in zip(top.values.tolist(), top.coords.tolist(), strict=True):
        b, h, j, t, s = coords
        assert s <= t and abs(x[b, h, j, t, s].item()) == value


def test_a_full_candidate_buffer_is_reported():
    gen = torch.Generator().manual_seed(0)
    q = torch.ones(1, 4, 16, 4)  # every logit ties: the threshold bin holds all of them
    ones = torch.ones(1, 4, 16, 4, device=DEVICE)
    summary = logit_stats(q.to(DEVICE), ones, 2, 2, 5, torch.float32, block=(16, 16), capacity=8)
    assert bool(summary.overflow)
    assert _unravel(summary.index[:1].cpu(), summary.shape).tolist() == [[0, 0, 0, 0, 0]]
    del gen


def test_profile_with_the_kernel_matches_the_eager_profile(arch):
    """End to end on a tiny model (real, non-dyadic weights: the kernel's sums may differ from torch's matmul in
    the last bit, so values compare to 1e-6; counts are exact). With the kernel the model runs sdpa, so the hidden
    states are sdpa's, equal to eager's up to rounding."""
    from diffquant import build_model
    from diffquant.profile import profile, token_batches

    from ..conftest import tiny_config
    from ..helpers import randomize_

    model = randomize_(build_model(tiny_config(arch, n_kv_heads=2))).eval().to(DEVICE)
    model.set_attn_impl("sdpa")
    data = token_batches(torch.randint(0, 101, (2 * 20,)), 20, 2)
    got = profile(model, data, topk=30, logits_kernel=True, progress=False).data
    want = profile(model, data, topk=30, logits_kernel=False, sync_free=False, progress=False).data
    assert all(block.attn.impl == "sdpa" for block in model.layers)
    g, w = got["sites"]["attn_logits"], want["sites"]["attn_logits"]
    assert g["count"] == w["count"] and g["calls"] == w["calls"] and g["nan"] == w["nan"] == 0
    assert g["top"] == pytest.approx(w["top"], rel=1e-6)
    assert g["median"] == pytest.approx(w["median"], rel=2 ** -10)
    assert g["locations"][0] == pytest.approx(w["locations"][0], rel=1e-6)
    gh, wh = got["sites"]["hidden"], want["sites"]["hidden"]
    assert gh["top"] == pytest.approx(wh["top"], rel=1e-5) and gh["count"] == wh["count"]
