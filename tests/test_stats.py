"""Streaming reducers of |x| against direct computations over the concatenated data."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diffquant import stats
from diffquant.stats import (
    ChannelMax,
    Moments,
    Quantiles,
    SiteStats,
    TopK,
    quantile_rank,
)

QS = (0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0)


def heavy(shape, gen, dtype=torch.float32):
    """Heavy-tailed: randn * exp(randn)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = x * torch.randn(shape, generator=gen, dtype=torch.float64).exp()
    return x.to(dtype)


def causal(t, s):
    return torch.ones(t, s, dtype=torch.bool).tril(s - t)


def random_chunks(gen, n, dtype=torch.float32, masked=True, lead=(2, 3)):
    """n attention-logit-like chunks [*lead, T, S] with a causal mask and a few planted big values."""
    chunks = []
    for c in range(n):
        t = int(torch.randint(1, 20, (1,), generator=gen))
        x = heavy((*lead, t, t), gen, dtype)
        x.view(-1)[torch.randint(0, x.numel(), (2,), generator=gen)] *= 1e3
        chunks.append((x, causal(t, t) if masked else None, c % 3))
    return chunks


def counted(x, mask):
    """Flat float64 |x| of counted finite entries and their flat indices."""
    a = x.abs().double().reshape(-1)
    keep = torch.isfinite(a)
    if mask is not None:
        keep &= torch.broadcast_to(mask, x.shape).reshape(-1)
    idx = keep.nonzero().squeeze(1)
    return a[idx], idx


def pooled(chunks):
    return torch.cat([counted(x, m)[0] for x, m, _ in chunks])


def reference_top(chunks, k):
    """Top-k by (value desc, call asc, flat index asc), built with stable sorts."""
    vals, calls, flats, coords, tags = [], [], [], [], []
    for c, (x, mask, tag) in enumerate(chunks):
        v, idx = counted(x, mask)
        vals.append(v)
        flats.append(idx)
        calls.append(torch.full_like(idx, c))
        tags.append(torch.full_like(idx, tag))
        coords.append(torch.stack(torch.unravel_index(idx, x.shape), dim=1))
    v, call, flat = torch.cat(vals), torch.cat(calls), torch.cat(flats)
    o = torch.argsort(flat, stable=True)
    o = o[torch.argsort(call[o], stable=True)]
    o = o[torch.argsort(v[o], descending=True, stable=True)][:k]
    return v[o], torch.cat(coords)[o], torch.cat(tags)[o], call[o]


def stream(reducer, chunks):
    for x, mask, tag in chunks:
        reducer.update(x, mask, tag=tag)
    return reducer


def assert_top_equal(tk, chunks, k):
    v, coords, tags, calls = reference_top(chunks, k)
    assert torch.equal(tk.values, v)
    assert torch.equal(tk.coords, coords)
    assert torch.equal(tk.tags, tags)
    assert torch.equal(tk.calls, calls)


# ----------------------------------------------------------------------------------------------- top-k


@pytest.mark.parametrize("k", [1, 37, 1000])
def test_topk_stream_equals_topk_of_concatenation(k):
    gen = torch.Generator().manual_seed(10 + k)
    chunks = random_chunks(gen, 30)
    tk = stream(TopK(k), chunks)
    allv = pooled(chunks)
    top = torch.topk(allv, k + 1).values
    assert torch.unique(top).numel() == k + 1  # no ties at or above the boundary: unique coordinates
    ref = torch.topk(allv, k)
    assert torch.equal(tk.values, ref.values)
    # coordinates: map torch.topk's winners back to (call, coords) and compare
    offsets = torch.tensor([0] + [counted(x, m)[0].numel() for x, m, _ in chunks]).cumsum(0)
    calls = torch.searchsorted(offsets, ref.indices, right=True) - 1
    assert torch.equal(tk.calls, calls)
    for i in range(len(calls)):
        x, mask, tag = chunks[calls[i]]
        flat = counted(x, mask)[1][ref.indices[i] - offsets[calls[i]]]
        assert tk.coords[i].tolist() == [int(c) for c in torch.unravel_index(flat, x.shape)]
        assert tk.tags[i] == tag


def test_topk_large_chunks_fast_path():
    """Big chunks exercise both the torch.topk path and the threshold path once k values are kept."""
    gen = torch.Generator().manual_seed(1)
    chunks = [(heavy((4, 64, 64), gen), causal(64, 64), i) for i in range(6)]
    chunks.append((heavy((4, 64, 64), gen) * 50, causal(64, 64), 9))  # many new winners at once
    assert_top_equal(stream(TopK(500), chunks), chunks, 500)


def test_topk_ties_are_deterministic():
    """Equal values: the earlier call wins, then the lower flat index."""
    x = torch.ones(3, 4)
    x[1, 2] = 2.0
    chunks = [(x.clone(), None, 0), (x.clone() * 2, None, 1), (x.clone(), None, 2)]
    tk = stream(TopK(5), chunks)
    assert tk.values.tolist() == [4.0, 2.0, 2.0, 2.0, 2.0]
    assert tk.calls.tolist() == [1, 0, 1, 1, 1]
    assert tk.coords.tolist() == [[1, 2], [1, 2], [0, 0], [0, 1], [0, 2]]
    assert_top_equal(tk, chunks, 5)
    again = stream(TopK(5), chunks)
    assert torch.equal(again.coords, tk.coords) and torch.equal(again.calls, tk.calls)


def test_topk_zero_ties_skip_masked_entries():
    """Fewer nonzero values than k: zeros fill up, and masked-out or non-finite entries never do."""
    x = torch.zeros(4, 6)
    x[0, 0], x[3, 5], x[1, 1] = 5.0, -3.0, float("nan")
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[0, 1:4] = False
    chunks = [(x, mask, 0), (torch.zeros(2, 6), None, 1)]
    tk = stream(TopK(6), chunks)
    assert tk.values.tolist() == [5.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    assert tk.coords.tolist() == [[0, 0], [3, 5], [0, 4], [0, 5], [1, 0], [1, 2]]
    assert_top_equal(tk, chunks, 6)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(1, 40),
    n=st.integers(1, 6),
    dtypes=st.lists(st.sampled_from([torch.float16, torch.bfloat16, torch.float32]), min_size=1, max_size=2),
)
def test_topk_property_ties_masks_mixed_dtypes(seed, k, n, dtypes):
    """Coarse values (many ties, also across dtypes), masks and NaN/Inf: exact against the reference."""
    gen = torch.Generator().manual_seed(seed)
    chunks = []
    for c in range(n):
        shape = tuple(int(s) for s in torch.randint(1, 6, (3,), generator=gen))
        x = torch.randint(-8, 9, shape, generator=gen) / 4 + heavy(shape, gen) * 1e-3 * (c % 2)
        x = x.to(dtypes[c % len(dtypes)])
        x.view(-1)[0] = float("nan") if c % 2 else float("inf")
        mask = torch.rand(shape[1:], generator=gen) < 0.7  # broadcast over the first dim
        chunks.append((x, mask, c))
    tk = stream(TopK(k), chunks)
    assert_top_equal(tk, chunks, k)
    assert torch.equal(tk.values, torch.topk(pooled(chunks), min(k, pooled(chunks).numel())).values)


def test_topk_masked_huge_value_never_appears():
    gen = torch.Generator().manual_seed(2)
    x = heavy((2, 2, 8, 8), gen)
    x[1, 0, 2, 7] = 1e30  # above the diagonal: masked
    s = SiteStats(topk=10, channel_dim=-1)
    s.update(x, causal(8, 8))
    r = s.result()
    assert max(r["top"]) < 1e3 and r["max"] < 1e3
    assert [1, 0, 2, 7] not in r["top_coords"]
    assert max(v for v in r["channels"]["max"] if v is not None) < 1e3


def test_topk_merge_equals_single_stream():
    gen = torch.Generator().manual_seed(3)
    chunks = random_chunks(gen, 12)
    a, b = stream(TopK(25), chunks[:5]), stream(TopK(25), chunks[5:])
    single = stream(TopK(25), chunks)
    a.merge(b)
    assert a.n_calls == single.n_calls
    for name in ("values", "coords", "tags", "calls"):
        assert torch.equal(getattr(a, name), getattr(single, name))


def test_topk_rejects_mismatches():
    tk = TopK(3)
    tk.update(torch.randn(2, 3))
    with pytest.raises(ValueError):
        tk.update(torch.randn(2, 3, 4))
    with pytest.raises(ValueError):
        tk.merge(TopK(4))
    with pytest.raises(TypeError):
        tk.update(torch.randn(2, 3), mask=torch.zeros(2, 3))  # additive masks are refused
    with pytest.raises(TypeError):
        tk.update(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        TopK(0)


# ------------------------------------------------------------------------------------------- quantiles


def sorted_rank(values, q):
    return float(torch.sort(values).values[quantile_rank(q, values.numel())])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_quantiles_exact(dtype):
    gen = torch.Generator().manual_seed(4)
    chunks = random_chunks(gen, 20, dtype)
    h = stream(Quantiles(), chunks)
    allv = torch.cat([x.abs()[..., m].reshape(-1) for x, m, _ in chunks])  # in the half dtype
    assert h.exact and h.mode in ("fp16", "bf16")
    assert h.median() == float(torch.median(allv))
    for q in QS:
        assert h.quantile(q) == sorted_rank(allv.double(), q)


def test_fp32_quantiles_within_bin_and_exact_pass():
    gen = torch.Generator().manual_seed(5)
    chunks = random_chunks(gen, 20, torch.float32)
    h = stream(Quantiles(), chunks)
    allv = pooled(chunks)
    assert not h.exact
    med = float(torch.median(allv))
    # lower edge of the bin: a lower bound within 2**-11 relative (the brief asks 2**-8)
    assert med * (1 - 2**-11) <= h.median() <= med
    for q in QS:
        ref = sorted_rank(allv, q)
        assert ref * (1 - 2**-11) <= h.quantile(q) <= ref
    ep = stream(h.exact_pass(QS), chunks)
    exact = ep.result()
    assert exact[0.5] == med
    assert all(exact[q] == sorted_rank(allv, q) for q in QS)


def test_float64_exact_pass_and_clamped_range():
    gen = torch.Generator().manual_seed(6)
    chunks = [(heavy((50,), gen, torch.float64), None, 0) for _ in range(4)]
    chunks.append((torch.tensor([1e300, -1e-300, 3.0], dtype=torch.float64), None, 0))
    h = stream(Quantiles(), chunks)
    allv = pooled(chunks)
    f32max = torch.finfo(torch.float32).max
    assert f32max * (1 - 2**-11) <= h.quantile(1.0) <= f32max  # beyond float32: the top finite bin
    ep = stream(h.exact_pass(QS), chunks)
    assert all(v == sorted_rank(allv, q) for q, v in ep.result().items())


def test_exact_pass_detects_other_data():
    gen = torch.Generator().manual_seed(7)
    x = heavy((1000,), gen)
    h = Quantiles()
    h.update(x)
    ep = h.exact_pass()
    ep.update(x[:500])
    with pytest.raises(ValueError):
        ep.result()


def test_quantiles_merge_mixed_dtypes_stays_exact():
    """bf16 and fp16 streams merged re-bin into float32 bins without losing exactness."""
    gen = torch.Generator().manual_seed(8)
    c16 = random_chunks(gen, 6, torch.float16)
    cb16 = random_chunks(gen, 6, torch.bfloat16)
    a, b = stream(Quantiles(), c16), stream(Quantiles(), cb16)
    a.merge(b)
    allv = pooled(c16 + cb16)
    assert a.exact and a.mode == "fp32" and a.count == allv.numel()
    for q in QS:
        assert a.quantile(q) == sorted_rank(allv, q)
    single = stream(Quantiles(), c16 + cb16)  # switching dtype mid-stream does the same
    assert torch.equal(single.hist, a.hist)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float16, torch.bfloat16]), q=st.floats(0, 1)
)
def test_half_quantile_property(seed, dtype, q):
    gen = torch.Generator().manual_seed(seed)
    x = heavy((int(torch.randint(1, 300, (1,), generator=gen)),), gen, dtype)
    mask = torch.rand(x.shape, generator=gen) < 0.8
    h = Quantiles()
    h.update(x, mask)
    v = counted(x, mask)[0]
    assert h.quantile(q) == (sorted_rank(v, q) if v.numel() else None)


# ------------------------------------------------------------------------------- moments, channels, site


def test_moments_count_nan_inf_without_poisoning():
    x = torch.tensor([[1.0, float("nan"), -float("inf")], [-2.0, float("inf"), float("nan")]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    m = Moments()
    m.update(x, mask)
    assert (m.count, m.nan, m.inf, m.max, m.mean_abs) == (2, 1, 2, 2.0, 1.5)
    s = SiteStats(topk=4)
    s.update(x, mask)
    r = s.result()
    assert r["top"] == [2.0, 1.0] and r["median"] == 1.0 and (r["nan"], r["inf"]) == (1, 2)


def test_channel_max_equals_direct():
    gen = torch.Generator().manual_seed(9)
    c = ChannelMax(dim=-1)
    ref = torch.full((12,), -1.0, dtype=torch.float64)
    for s in (5, 12, 8):  # the channel count grows
        x = heavy((3, 4, s), gen)
        x[0, 0, 0] = float("inf")
        mask = torch.rand(4, s, generator=gen) < 0.6
        mask[:, 1] = False  # channel 1 is never counted: None
        c.update(x, mask)
        a = torch.where(mask & torch.isfinite(x), x.abs(), -1.0).double()
        ref[:s] = torch.maximum(ref[:s], a.amax(dim=(0, 1)))
    assert c.result()["max"] == [v if v >= 0 else None for v in ref.tolist()]
    assert c.result()["max"][1] is None
    order = torch.sort(ref, descending=True, stable=True).indices[:4]
    assert c.top_channels(4) == [(int(i), float(ref[i])) for i in order]
    mid = ChannelMax(dim=1)
    x = heavy((2, 7, 3), gen)
    mid.update(x)
    assert torch.equal(mid.max, x.abs().amax(dim=(0, 2)).double())


def test_site_stats_merge_equals_single_stream():
    gen = torch.Generator().manual_seed(11)
    chunks = random_chunks(gen, 10, torch.bfloat16)
    a = stream(SiteStats(topk=20, channel_dim=-2), chunks[:4])
    b = stream(SiteStats(topk=20, channel_dim=-2), chunks[4:])
    single = stream(SiteStats(topk=20, channel_dim=-2), chunks).result()
    merged = a.merge(b).result()
    assert merged["mean_abs"] == pytest.approx(single.pop("mean_abs"), rel=1e-12)
    merged.pop("mean_abs")
    # float64 sums merged in another order: equal up to rounding
    assert merged["kurtosis"].pop("mean") == pytest.approx(single["kurtosis"].pop("mean"), rel=1e-12)
    assert merged == single
    allv = pooled(chunks)
    assert single["median"] == float(torch.median(allv)) and single["quantiles_exact"]
    assert single["count"] == allv.numel() and single["max"] == float(allv.max())


def test_site_stats_exact_median_fp32_and_json_round_trip():
    gen = torch.Generator().manual_seed(12)
    chunks = random_chunks(gen, 8, torch.float32)
    s = stream(SiteStats(topk=10, exact_median=True), chunks)
    assert s.needs_exact_pass
    stream(s.exact_pass(), chunks)
    r = s.result()
    allv = pooled(chunks)
    assert not s.needs_exact_pass and r["quantiles_exact"]
    assert r["median"] == float(torch.median(allv))
    assert r["quantiles"]["0.99"] == sorted_rank(allv, 0.99)
    assert set(r["quantiles"]) == {"0.5", "0.9", "0.99", "0.999"}
    assert r["mean_abs"] == pytest.approx(float(allv.mean()), rel=1e-12)
    back = SiteStats.from_state_dict(json.loads(json.dumps(s.state_dict())))
    r2 = back.result()  # no exact pass on the copy: histogram values
    assert r2["top"] == r["top"] and r2["top_coords"] == r["top_coords"] and r2["count"] == r["count"]
    assert not r2["quantiles_exact"] and math.isclose(r2["median"], r["median"], rel_tol=2**-11)


def test_empty_input_gives_none_not_crash():
    s = SiteStats(topk=5, exact_median=True, channel_dim=-1)
    r0 = s.result()
    s.update(torch.randn(2, 3, 4), mask=torch.zeros(3, 4, dtype=torch.bool))
    s.update(torch.full((2, 3, 4), float("nan")), mask=torch.ones(4, dtype=torch.bool))
    s.update(torch.empty(0, 3, 4))
    r = s.result()
    for out in (r0, r):
        assert out["count"] == 0 and out["median"] is None and out["top"] == [] and out["max"] is None
        assert out["mean_abs"] is None and all(v is None for v in out["quantiles"].values())
    assert r["nan"] == 24 and r["calls"] == 3 and r["channels"]["top"] == []
    json.dumps(r)
    stream(s.exact_pass(), [])  # nothing to check, nothing to fail
    assert s.result()["median"] is None


def test_small_internal_chunks_give_the_same_results(monkeypatch):
    """Chunked internals (top-k, boundary ties, zero fill, histogram, sums, exact pass) at any chunk size."""
    monkeypatch.setattr(stats, "_CHUNK", 7)
    gen = torch.Generator().manual_seed(13)
    first = torch.zeros(5, 9)
    first[1, 3], first[4, 0], first[2, 2] = 2.0, -1.0, float("nan")
    mask = torch.rand(5, 9, generator=gen) < 0.5
    mask[2, 2] = True
    chunks = [(first, mask, 0)]  # fewer nonzeros than k: zero ties
    for c in range(1, 8):
        x = torch.randint(-6, 7, (5, 9), generator=gen) / 2 + heavy((5, 9), gen) * (c % 2)
        chunks.append((x, torch.rand(9, generator=gen) < 0.8, c))
    s = stream(SiteStats(topk=30, exact_median=True, channel_dim=0), chunks)
    assert_top_equal(s.topk, chunks, 30)
    stream(s.exact_pass(), chunks)
    r, allv = s.result(), pooled(chunks)
    assert r["median"] == float(torch.median(allv)) and r["quantiles_exact"]
    assert r["quantiles"]["0.9"] == sorted_rank(allv, 0.9)
    assert r["count"] == allv.numel() and r["nan"] == 1
    assert r["mean_abs"] == pytest.approx(float(allv.mean()), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_log2_histogram_counts_each_octave(dtype):
    x = (torch.randn(5000) * torch.exp(2 * torch.randn(5000))).to(dtype)
    x[:7] = 0
    q = Quantiles()
    q.update(x)
    h = q.log2_histogram()
    a = x.abs().double()
    assert h["zero"] == 7 and sum(h["counts"]) + h["zero"] == x.numel()
    ref = torch.floor(torch.log2(a[a > 0]))
    for e, c in zip(h["exponents"], h["counts"], strict=True):
        assert c == int((ref == e).sum())


def test_kurtosis_streams_to_the_float64_brute_force():
    """Bondarenko et al.'s metric: per-token kurtosis across channels, averaged; against a numpy/float64 loop."""
    import numpy as np

    from diffquant.stats import Kurtosis, SiteStats

    parts = [torch.randn(3, 7, 16) * torch.rand(1, 1, 16) * 5, torch.randn(2, 5, 16)]
    parts[0][1, 2, 3] = 80.0  # an outlier channel makes one token's kurtosis large
    streamed = Kurtosis()
    for p in parts:
        streamed.update(p)
    rows = np.concatenate([p.double().reshape(-1, 16).numpy() for p in parts])
    ref = [((r - r.mean()) ** 4).mean() / (r.std(ddof=1) ** 4 + 1e-6) for r in rows]
    res = streamed.result()
    assert res["vectors"] == len(ref) == 31
    assert res["mean"] == pytest.approx(float(np.mean(ref)), rel=1e-12)
    assert res["max"] == pytest.approx(float(np.max(ref)), rel=1e-12) and res["max"] > 10
    merged = Kurtosis().merge(streamed)
    assert merged.result() == res and Kurtosis.from_state_dict(streamed.state_dict()).result() == res
    site = SiteStats(topk=3, channel_dim=-1)
    for p in parts:
        site.update(p)
    assert site.result()["kurtosis"]["mean"] == pytest.approx(res["mean"], rel=1e-12)
    nan = torch.randn(2, 16)
    nan[0, 0] = float("nan")
    k = Kurtosis()
    k.update(nan)
    assert k.result()["vectors"] == 1
