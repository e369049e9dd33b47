"""Sync-free streaming reducers: every statistic of :class:`~diffquant.stats.SiteStats` stays on x's device.

``DeviceSiteStats.update`` launches kernels only: no ``.item()``, ``.cpu()``, ``.tolist()`` or data-dependent
shapes (``nonzero``, boolean indexing), so a GPU never waits for the host between probe calls. ``host()`` moves
everything to the CPU once, at the end of a run, and returns an ordinary :class:`SiteStats` whose results equal
the streaming host path's (top-k values, coordinates, tags and calls; histogram, quantiles, counts, NaN / Inf
counts, maxima, channel maxima, kurtosis). The one difference: each update's sum of |x| is taken in float64 on the
device (more accurate than the host path's float32 blocks), so ``mean_abs`` agrees to its documented ~1e-6.

How each statistic avoids a sync:

* top-k: a composite int64 key ``(|x| bit pattern << 32) | (2**32 - 1 - position)`` orders by value, then by the
  lower position, so ``torch.topk`` of the keys is the deterministic top-k the host path picks; non-finite
  entries get key -1. Running entries merge by a stable sort (earlier calls win ties). 8-byte data sorts instead.
* histogram: the bit-pattern bins of :func:`~diffquant.stats._bins` are added with ``index_add_`` (CUDA's
  ``bincount`` reads the largest bin on the host); NaN and ±Inf land in bins of their own, so the counts, NaN
  and Inf counts come from the histogram at the end.
* a masked update is gathered with its counted positions (``keep``), computed once per shape by the caller.
"""

from __future__ import annotations

import torch

from .stats import (
    _F32_MAX,
    _HALF_MODES,
    _NBINS,
    _SHIFT32,
    ChannelMax,
    ExactSum,
    Kurtosis,
    Moments,
    Quantiles,
    SiteStats,
    TopK,
    _unravel,
    row_kurtosis,
)

__all__ = ["CandidateOverflow", "DeviceSiteStats", "DeviceTopK", "keep_positions"]


class CandidateOverflow(RuntimeError):
    """The kernel path's top-k candidates did not fit their buffer (massive ties): redo the run another way."""

_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_LOW32 = (1 << 32) - 1
_INF_BITS = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80, torch.float32: 0x7F800000,
             torch.float64: 0x7FF0000000000000}
_FP32_INF_BIN = 0x7F800000 >> _SHIFT32  # fp32 mode: finite bins lie below, +Inf on it, NaN above (shifted by 1)


def keep_positions(mask: torch.Tensor, shape: tuple[int, ...]) -> tuple[torch.Tensor, int] | None:
    """Counted positions within one trailing block of ``shape`` and that block's size, for a mask that varies
    over trailing dims only (see stats._trailing_block); None otherwise. Syncs (nonzero): cache it per shape."""
    from .stats import _trailing_block

    block = _trailing_block(mask, shape)
    if block is None:
        return None
    return mask.reshape(block).nonzero().squeeze(1), block


def _gather_abs(x: torch.Tensor, keep: tuple[torch.Tensor, int] | None) -> torch.Tensor:
    """Flat |x| of the counted entries in row-major order (all entries when ``keep`` is None)."""
    x = x.detach()
    if keep is None:
        return x.abs().reshape(-1)
    positions, block = keep
    return x.reshape(-1, block).index_select(1, positions).view(-1).abs_()


def _to_flat_index(idx: torch.Tensor, keep: tuple[torch.Tensor, int] | None) -> torch.Tensor:
    """Positions in the gathered vector -> row-major flat indices into x (monotone)."""
    if keep is None:
        return idx
    positions, block = keep
    k = positions.numel()
    return torch.div(idx, k, rounding_mode="floor") * block + positions[idx % k]


class DeviceTopK:
    """Exact top-k of |x| on the device; ``host()`` gives the :class:`TopK` the host path would hold."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = int(k)
        self.shapes: list[tuple[int, ...]] = []  # per call, to unravel flat indices at the end
        self.tags: list[int] = []
        self.vals = self.idx = self.calls = None  # device: float64 (-1 = empty slot), int64, int64

    @property
    def n_calls(self) -> int:
        return len(self.shapes)

    def ingest(self, a: torch.Tensor, keep, shape: tuple[int, ...], tag: int) -> None:
        """``a``: flat |x| of counted entries (see _gather_abs)."""
        vals, pos = _select_top(a, self.k)
        self.absorb(vals, _to_flat_index(pos, keep), shape, tag)

    def absorb(self, vals: torch.Tensor, idx: torch.Tensor, shape: tuple[int, ...], tag: int) -> None:
        """Candidates of one call, ordered by value descending then flat index ascending; value -1 = none."""
        call = torch.full_like(idx, self.n_calls)
        self.shapes.append(tuple(shape))
        self.tags.append(int(tag))
        if self.vals is not None:  # kept entries first: the stable sort lets earlier calls win ties
            vals, idx, call = (torch.cat([old, new]) for old, new in
                               ((self.vals, vals), (self.idx, idx), (self.calls, call)))
        order = torch.sort(vals, descending=True, stable=True).indices[: self.k]
        self.vals, self.idx, self.calls = vals[order], idx[order], call[order]

    def host(self) -> TopK:
        out = TopK(self.k)
        out.n_calls = self.n_calls
        if not self.shapes:
            return out
        out._set_ndim(len(self.shapes[0]))
        if any(len(s) != out.ndim for s in self.shapes):
            raise ValueError("TopK saw tensors of different dimensions")
        vals, idx, calls = self.vals.cpu(), self.idx.cpu(), self.calls.cpu()
        real = vals >= 0
        vals, idx, calls = vals[real], idx[real], calls[real]
        out.values, out.calls = vals, calls
        coords = [_unravel(i.view(1), self.shapes[c])[0] for i, c in zip(idx, calls.tolist(), strict=True)]
        out.coords = torch.stack(coords) if coords else torch.empty(0, out.ndim, dtype=torch.long)
        out.tags = torch.tensor([self.tags[c] for c in calls.tolist()], dtype=torch.long)
        return out


def _select_top(a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-min(k, n) of flat |x| by value descending then position ascending, non-finite excluded (value -1).
    Returns float64 values and int64 positions, without a host sync."""
    n = a.numel()
    kk = min(k, n)
    if n == 0:
        return a.new_empty(0, dtype=torch.float64), a.new_empty(0, dtype=torch.long)
    bits = a.view(_INT[a.element_size()])
    valid = bits < _INF_BITS[a.dtype]
    if a.element_size() == 8 or n > _LOW32:  # no room for the position beside the pattern: a stable sort
        order = torch.sort(torch.where(valid, a, -1).double(), descending=True, stable=True).indices[:kk]
        return torch.where(valid[order], a[order].double(), -1.0), order
    positions = torch.arange(n, device=a.device)
    keys = (bits.to(torch.int64) << 32) | (_LOW32 - positions)
    keys = torch.where(valid, keys, -1)
    top = torch.topk(keys, kk, sorted=True).values  # distinct keys: a unique, ordered answer
    pos = _LOW32 - (top & _LOW32)
    pattern = (top >> 32).to(_INT[a.element_size()])
    vals = torch.where(top >= 0, pattern.view(a.dtype).double(), -1.0)
    return vals, torch.where(top >= 0, pos, 0)


def _bin_patterns(a: torch.Tensor) -> tuple[str, torch.Tensor, int]:
    """(mode, bin of each value, number of bins) with NaN and ±Inf in bins past the finite ones."""
    mode = _HALF_MODES.get(a.dtype, "fp32")
    if mode != "fp32":
        return mode, a.view(torch.int16).to(torch.int32), _NBINS[mode]  # patterns: Inf and NaN included
    if a.dtype == torch.float32:
        bits = a.view(torch.int32)
        return mode, (bits >> _SHIFT32) + (bits > 0x7F800000).to(torch.int32), _NBINS[mode] + 1
    # float64 (or others): clamp to float32 as stats._bins does; non-finite to the Inf / NaN bins
    bins = a.clamp(max=_F32_MAX).to(torch.float32).view(torch.int32) >> _SHIFT32
    bins = torch.where(torch.isinf(a), _FP32_INF_BIN, bins)
    return mode, torch.where(torch.isnan(a), _FP32_INF_BIN + 1, bins), _NBINS[mode] + 1


_FINITE_END = {"fp16": 0x7C00, "bf16": 0x7F80, "fp32": _FP32_INF_BIN}  # first non-finite bin


class DeviceQuantiles:
    """Bit-pattern histograms on the device, one per mode in order of appearance."""

    def __init__(self):
        self.hists: dict[str, torch.Tensor] = {}
        self.lossy = False

    def ingest(self, a: torch.Tensor) -> None:
        if a.numel() == 0:
            return
        self.lossy |= a.dtype not in _HALF_MODES
        mode, bins, nbins = _bin_patterns(a)
        self.add_counts(mode, bins, nbins)

    def add_counts(self, mode: str, bins: torch.Tensor, nbins: int, weights: torch.Tensor | None = None) -> None:
        hist = self.hists.get(mode)
        if hist is None:
            hist = self.hists[mode] = torch.zeros(nbins, dtype=torch.long, device=bins.device)
        if weights is None:
            weights = torch.ones(1, dtype=torch.long, device=bins.device).expand(bins.numel())
        hist.index_add_(0, bins.reshape(-1), weights)

    def add_histogram(self, mode: str, counts: torch.Tensor) -> None:
        hist = self.hists.get(mode)
        self.hists[mode] = counts.clone() if hist is None else hist.add_(counts)

    def host(self) -> tuple[Quantiles, int, int]:
        """The host histogram (finite values only), and the NaN and Inf counts."""
        out, nan, inf = Quantiles(), 0, 0
        for mode, hist in self.hists.items():
            hist = hist.cpu()
            end = _FINITE_END[mode]
            inf += int(hist[end])  # |x| patterns: +Inf at the end of the finite bins, NaN after it
            nan += int(hist[end + 1:].sum())
            part = Quantiles()
            part._adopt(mode)
            part.hist = hist[: _NBINS[mode]].clone()
            part.hist[end:] = 0
            part.count = int(part.hist.sum())
            out.merge(part)
        out.lossy = self.lossy and out.count > 0
        return out, nan, inf


class DeviceSiteStats:
    """The device twin of :class:`SiteStats` (see the module doc); ``host()`` returns the SiteStats."""

    def __init__(self, topk: int = 100, exact_median: bool = False, channel_dim: int | None = None):
        self.k, self.exact_median, self.channel_dim = topk, exact_median, channel_dim
        self.topk = DeviceTopK(topk)
        self.hist = DeviceQuantiles()
        self.sums: list[torch.Tensor] = []  # float64 sum of finite |x| per update
        self.max: torch.Tensor | None = None
        self.channel_max: torch.Tensor | None = None  # float64, -1 = no counted entry
        self.kurt_sums: list[torch.Tensor] = []
        self.kurt_count: torch.Tensor | None = None
        self.kurt_max: torch.Tensor | None = None
        self.overflow: torch.Tensor | None = None  # kernel path: a candidate buffer was too small

    def update(self, x: torch.Tensor, keep: tuple[torch.Tensor, int] | None = None, tag: int = 0) -> None:
        """``keep``: the counted positions of a trailing-block mask (:func:`keep_positions`), or None: all count."""
        if not x.is_floating_point():
            raise TypeError(f"expected a floating tensor, got {x.dtype}")
        if keep is not None and self.channel_dim is not None:
            raise ValueError("per-channel statistics need the whole tensor: no mask")
        a = _gather_abs(x, keep)
        self.topk.ingest(a, keep, tuple(x.shape), tag)
        self.hist.ingest(a)
        self.add_moments(a)
        if self.channel_dim is not None and x.ndim:
            self._channels(a.view(x.shape))
            self._kurtosis(x.detach())

    def absorb_logits(self, summary, tag: int = 0) -> None:
        """One call's :class:`~diffquant.kernels.logit_stats.LogitSummary` (the logits were never materialised)."""
        self.topk.absorb(summary.values, summary.index, summary.shape, tag)
        self.hist.lossy |= summary.mode not in ("fp16", "bf16")
        self.hist.add_histogram(summary.mode, summary.hist)
        self.sums.append(summary.total)
        self.take_max(summary.values[:1].clamp(min=0).sum())  # the top value (0 when nothing counted)
        self.overflow = summary.overflow if self.overflow is None else self.overflow | summary.overflow

    def add_moments(self, a: torch.Tensor) -> None:
        finite = torch.where(a.view(_INT[a.element_size()]) < _INF_BITS[a.dtype], a, 0)
        self.sums.append(finite.sum(dtype=torch.float64))
        self.take_max(finite.amax().double() if a.numel() else None)

    def take_max(self, m: torch.Tensor | None) -> None:
        if m is not None:
            self.max = m if self.max is None else torch.maximum(self.max, m)

    def _channels(self, a: torch.Tensor) -> None:
        d = self.channel_dim % a.ndim
        seen = torch.where(a.view(_INT[a.element_size()]) < _INF_BITS[a.dtype], a.double(), -1.0)
        others = [i for i in range(a.ndim) if i != d]
        m = seen.amax(dim=others) if others else seen
        if self.channel_max is None:
            self.channel_max = m
            return
        n, have = m.numel(), self.channel_max.numel()
        if n > have:
            self.channel_max = torch.cat([self.channel_max, m.new_full((n - have,), -1.0)])
        self.channel_max[:n] = torch.maximum(self.channel_max[:n], m)

    def _kurtosis(self, x: torch.Tensor) -> None:
        if x.numel() == 0 or x.shape[self.channel_dim] < 2:
            return
        k = row_kurtosis(x, self.channel_dim).reshape(-1)
        finite = torch.isfinite(k)
        self.kurt_sums.append(torch.where(finite, k, 0).sum())
        count = finite.sum()
        top = torch.where(finite, k, -torch.inf).amax()
        self.kurt_count = count if self.kurt_count is None else self.kurt_count + count
        self.kurt_max = top if self.kurt_max is None else torch.maximum(self.kurt_max, top)

    def host(self) -> SiteStats:
        """Everything to the CPU (the run's one sync) as the SiteStats the host path would hold."""
        if self.overflow is not None and bool(self.overflow):
            raise CandidateOverflow("a logit-statistics candidate buffer overflowed: its top-k is not exact")
        out = SiteStats(self.k, self.exact_median, self.channel_dim)
        out.topk = self.topk.host()
        out.hist, nan, inf = self.hist.host()
        out.moments = self._host_moments(nan, inf, out.hist.count)
        if self.channel_dim is not None:
            out.channels = ChannelMax(self.channel_dim)
            if self.channel_max is not None:
                out.channels.max = self.channel_max.cpu()
            out.kurtosis = self._host_kurtosis()
        return out

    def _host_moments(self, nan: int, inf: int, count: int) -> Moments:
        m = Moments()
        m.count, m.nan, m.inf = count, nan, inf
        if count:
            m._sum = ExactSum(torch.stack(self.sums).cpu().tolist())
            m.max = float(self.max)
        return m

    def _host_kurtosis(self) -> Kurtosis:
        k = Kurtosis(self.channel_dim)
        if self.kurt_count is not None and int(self.kurt_count):
            k.count = int(self.kurt_count)
            k._sum = ExactSum(torch.stack(self.kurt_sums).cpu().tolist())
            k.max = float(self.kurt_max)
        return k
