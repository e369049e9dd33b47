"""The sync-free reducers (stats_device) against the host path (stats.SiteStats) on the same streams."""

import pytest
import torch

from diffquant.stats import SiteStats
from diffquant.stats_device import DeviceSiteStats, keep_positions

from ..test_stats import causal, heavy, random_chunks

SYNC_CALLS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__", "numpy")


def device_stream(chunks, k, channel_dim=None):
    dev = DeviceSiteStats(k, channel_dim=channel_dim)
    for x, mask, tag in chunks:
        dev.update(x, None if mask is None else keep_positions(mask, tuple(x.shape)), tag=tag)
    return dev


def host_stream(chunks, k, channel_dim=None):
    host = SiteStats(k, channel_dim=channel_dim)
    for x, mask, tag in chunks:
        host.update(x, mask, tag=tag)
    return host


def assert_same(dev: DeviceSiteStats, host: SiteStats):
    got, want = dev.host().result(), host.result()
    mean, want_mean = got.pop("mean_abs"), want.pop("mean_abs")
    assert mean == want_mean or mean == pytest.approx(want_mean, rel=1e-6)  # float64 vs float32 blocks
    assert got == want
    assert dev.host().hist.state_dict() == host.hist.state_dict()


def with_ties_and_nonfinite(chunks, gen):
    out = []
    for x, mask, tag in chunks:
        x = (x * 4).round() / 4  # many equal values, zeros included: ties decided by position
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=gen)
        flat[picks[0]], flat[picks[1]] = float("nan"), float("inf")
        out.append((x, mask, tag))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("k", [1, 37, 1000])
def test_device_stream_equals_host_stream(dtype, k):
    gen = torch.Generator().manual_seed(k)
    for masked in (True, False):
        chunks = with_ties_and_nonfinite(random_chunks(gen, 9, dtype, masked=masked), gen)
        assert_same(device_stream(chunks, k), host_stream(chunks, k))


def test_mixed_dtypes_rebin_as_the_host_does():
    gen = torch.Generator().manual_seed(3)
    chunks = [(x.to(dt), m, t) for (x, m, t), dt in
              zip(random_chunks(gen, 6), [torch.float16, torch.bfloat16, torch.float32] * 2, strict=True)]
    assert_same(device_stream(chunks, 20), host_stream(chunks, 20))


def test_per_channel_maxima_and_kurtosis_equal_the_host():
    gen = torch.Generator().manual_seed(5)
    chunks = []
    for c in range(5):
        x = heavy((2, 7, 12), gen)
        x[0, c % 7, c] = float("nan") if c % 2 else float("inf")
        chunks.append((x, None, c))
    chunks.append((torch.full((1, 3, 12), float("nan")), None, 9))  # nothing counts in this one
    assert_same(device_stream(chunks, 10, channel_dim=-1), host_stream(chunks, 10, channel_dim=-1))


def test_empty_and_all_masked_streams():
    dev = DeviceSiteStats(5)
    dev.update(torch.full((2, 3, 3), float("nan")), keep_positions(causal(3, 3), (2, 3, 3)))
    host = SiteStats(5)
    host.update(torch.full((2, 3, 3), float("nan")), causal(3, 3))
    assert_same(dev, host)
    assert DeviceSiteStats(5).host().result() == SiteStats(5).result()


def test_no_host_sync_per_update(monkeypatch):
    """After the counted positions are known, an update launches kernels only: no sync entry point is hit."""
    gen = torch.Generator().manual_seed(1)
    chunks = [(heavy((3, 2, 16, 16), gen), causal(16, 16), c) for c in range(4)]
    hidden = [(heavy((3, 16, 8), gen), None, c) for c in range(3)]
    keep = keep_positions(causal(16, 16), (3, 2, 16, 16))
    logits, states = DeviceSiteStats(10), DeviceSiteStats(10, channel_dim=-1)
    hits = []
    for name in SYNC_CALLS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _o=original, **kw: (
            hits.append(_n), _o(self, *a, **kw))[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **kw: hits.append("synchronize"))
    for x, _, tag in chunks:
        logits.update(x, keep, tag=tag)
    for x, _, tag in hidden:
        states.update(x, None, tag=tag)
    assert hits == []
    monkeypatch.undo()
    assert_same(logits, host_stream(chunks, 10))
    assert_same(states, host_stream(hidden, 10, channel_dim=-1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_updates_never_sync():
    gen = torch.Generator().manual_seed(2)
    chunks = [(heavy((4, 2, 64, 64), gen), causal(64, 64), c) for c in range(3)]
    keep = keep_positions(causal(64, 64).cuda(), (4, 2, 64, 64))
    dev = DeviceSiteStats(50)
    dev.update(chunks[0][0].cuda(), keep, tag=0)  # first call: allocations
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, _, tag in chunks[1:]:
            dev.update(x.cuda(), keep, tag=tag)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same(dev, host_stream(chunks, 50))
