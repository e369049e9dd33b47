"""The fast paths of the streaming reducers: causal masks applied by gathering, float32 block sums, skipped
top-k scans; still equal to torch.topk / torch.median brute force on fresh random data."""

import pytest
import torch

from diffquant import stats
from diffquant.stats import SiteStats, TopK
from tests.test_stats import assert_top_equal, causal, heavy, pooled, stream


def logit_chunks(gen, n, lead=(2, 3, 2), t=40, dtype=torch.float32):
    """Attention-logit-like [*lead, T, S] chunks with causal masks, some continuing a KV cache (T < S)."""
    chunks = []
    for c in range(n):
        s = t + 8 * (c % 2)
        x = heavy((*lead, t, s), gen, dtype)
        x.view(-1)[torch.randint(0, x.numel(), (3,), generator=gen)] *= 100
        chunks.append((x, causal(t, s), c % 4))
    return chunks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathered_causal_entries_equal_brute_force(dtype):
    gen = torch.Generator().manual_seed(21)
    chunks = logit_chunks(gen, 6, dtype=dtype)
    s = stream(SiteStats(topk=50, exact_median=True), chunks)
    assert_top_equal(s.topk, chunks, 50)
    stream(s.exact_pass(), chunks)
    r, allv = s.result(), pooled(chunks)
    assert r["median"] == float(torch.median(allv)) and r["count"] == allv.numel()
    assert r["max"] == float(allv.max())
    assert r["mean_abs"] == pytest.approx(float(allv.mean()), rel=1e-6)  # float32 block sums
    top = torch.topk(allv, 50).values
    assert torch.equal(torch.tensor(r["top"], dtype=torch.float64), top)


def test_nan_and_inf_inside_the_kept_entries_are_counted_apart():
    gen = torch.Generator().manual_seed(22)
    chunks = logit_chunks(gen, 3)
    x = chunks[1][0]
    x[0, 0, 0, 5, 2], x[1, 2, 1, 9, 0] = float("nan"), float("inf")  # both causally kept
    x[0, 0, 0, 2, 30] = float("nan")  # masked out: never counted
    s = stream(SiteStats(topk=20), chunks)
    r, allv = s.result(), pooled(chunks)
    assert (r["nan"], r["inf"], r["count"]) == (1, 1, allv.numel())
    assert_top_equal(s.topk, chunks, 20)


def test_large_sums_keep_a_small_relative_error():
    gen = torch.Generator().manual_seed(23)
    x = heavy((3, 5000), gen)
    s = SiteStats(topk=5)
    s.update(x)
    assert s.result()["mean_abs"] == pytest.approx(float(x.double().abs().mean()), rel=1e-6)
    big = torch.full((4, 1024), 3e36)  # would overflow a float32 block sum: the float64 way
    s = SiteStats(topk=5)
    s.update(big)
    assert s.result()["mean_abs"] == pytest.approx(float(big.double().mean()), rel=1e-12)


def test_later_calls_below_the_kth_value_are_skipped_without_a_scan(monkeypatch):
    tk = TopK(3)
    tk.update(torch.tensor([5.0, -7.0, 6.0, 1.0]))
    scans = []
    real = stats._above
    monkeypatch.setattr(stats, "_above", lambda *a: scans.append(1) or real(*a))
    tk.update(torch.tensor([4.0, -5.0]))  # max |x| 5 <= the 3rd kept value (5): nothing can enter
    assert scans == [] and tk.values.tolist() == [7.0, 6.0, 5.0] and tk.calls.tolist() == [0, 0, 0]
    tk.update(torch.tensor([0.5, 6.5]))
    assert scans == [1] and tk.values.tolist() == [7.0, 6.5, 6.0]


@pytest.mark.parametrize("mask_shape, shape, block", [
    ((4, 5), (2, 3, 4, 5), 20), ((1, 1, 4, 5), (2, 3, 4, 5), 20), ((5,), (2, 5), 5), ((3, 1), (2, 3, 4), None),
    ((2, 3, 4), (2, 3, 4), 24), ((1,), (2, 3), 1), ((2, 3, 4, 5), (3, 4, 5), None),
])
def test_trailing_blocks(mask_shape, shape, block):
    assert stats._trailing_block(torch.ones(mask_shape, dtype=torch.bool), shape) == block
