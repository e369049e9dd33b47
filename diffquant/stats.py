"""Exact streaming reducers of |x|: top-k, quantiles, moments and per-channel maxima.

Pure classes over tensors, no model knowledge. Every reducer offers

* ``update(x, mask=None, tag=0)``: ``x`` any shape, floating dtype, any device; ``mask`` an optional
  boolean tensor broadcastable to ``x`` (True = the entry counts); ``tag`` an int stored with top-k
  entries (e.g. a layer index) and ignored elsewhere;
* ``merge(other)``: as if ``other``'s updates had followed ``self``'s;
* ``result()`` (plain JSON types) and ``state_dict()`` / ``from_state_dict()`` (JSON round trip).

NaN and ±Inf never enter top-k, quantiles, mean, max or channel maxima; :class:`Moments` counts them.
Rank conventions: ``quantile(q)`` is the element of ascending rank ``floor(q * (n - 1))`` (0-based),
so the median is the lower median, which is what ``torch.median`` returns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_QUANTILES",
    "ChannelMax",
    "ExactPass",
    "ExactSum",
    "Moments",
    "Quantiles",
    "SiteStats",
    "TopK",
    "quantile_rank",
]

DEFAULT_QUANTILES = (0.5, 0.9, 0.99, 0.999)

_HALF_MODES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_MODE_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
_NBINS = {"fp16": 1 << 15, "bf16": 1 << 15, "fp32": 1 << 19}
_SHIFT32 = 12  # float32 bins keep 1 + 11 significand bits: relative width <= 2**-11
_F32_MAX = torch.finfo(torch.float32).max
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 23  # elements per step where a per-element temporary (int32, float64) would cost memory
_COMPACT_AT = 1 << 16  # pending values in an exact-pass bin before deduplication
_SUM_BLOCK = 1024  # values per float32 partial sum of Moments


def quantile_rank(q: float, n: int) -> int:
    """0-based ascending rank of quantile ``q`` among ``n`` values: floor(q * (n - 1))."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must lie in [0, 1], got {q}")
    return math.floor(q * (n - 1))


class _Prepared:
    """|x| of one update, computed once and shared by the reducers of a SiteStats.

    ``a`` holds |x| in x's dtype (no float64 copy). A mask that varies only over trailing dims (the causal
    (T, S) mask of attention logits, the same for every batch and head) is applied by gathering the counted
    positions once (``compact``): ``a`` is then the flat |x| of counted entries only, in row-major order, and
    ``flat_index`` maps its positions back. Otherwise ``a`` has x's shape and every entry that does not count
    is set to 0. Either way NaN and ±Inf are set to 0 too, and ``valid`` (None when every entry of ``a``
    counts) tells those zeros from real ones, so sums, maxima and histograms skip a compaction. ``amax`` is
    the largest counted |x| when it was found on the way (finite data), else None.
    """

    def __init__(self, x: torch.Tensor, mask: torch.Tensor | None, compact: bool = True):
        if not x.is_floating_point():
            raise TypeError(f"expected a floating tensor, got {x.dtype}")
        self.shape = tuple(x.shape)
        self.dtype = x.dtype
        self.keep: torch.Tensor | None = None  # counted positions within one trailing block
        x = x.detach()
        if mask is not None:
            if mask.dtype != torch.bool:  # an additive float mask would silently count wrong entries
                raise TypeError(f"mask must be boolean, got {mask.dtype}")
            mask = mask.to(x.device)
            self.block = _trailing_block(mask, self.shape) if compact and x.numel() else None
            if self.block is not None:
                self.keep = mask.reshape(self.block).nonzero().squeeze(1)
                self.a = x.reshape(-1, self.block).index_select(1, self.keep).view(-1).abs_()
                mask = None
        if self.keep is None:
            self.a = torch.empty(self.shape, dtype=x.dtype, device=x.device)  # row-major flat indices
            torch.abs(x, out=self.a)
        self.amax: float | None = None
        self.n_nan = self.n_inf = 0
        if mask is None:
            top = float(self.a.max()) if self.a.numel() else 0.0  # NaN if any NaN, inf if any inf
            if top <= torch.finfo(x.dtype).max:
                self.amax = top if self.a.numel() else None
                self.n_valid, self.n_zeroed, self.valid = self.a.numel(), 0, None
                return
        valid = self.a <= torch.finfo(x.dtype).max  # False for NaN and ±Inf; cheaper than isfinite
        if mask is not None:
            mask = torch.broadcast_to(mask, self.shape)
            valid &= mask
            n_counted = int(torch.count_nonzero(mask))
        else:
            n_counted = self.a.numel()
        self.n_valid = int(torch.count_nonzero(valid))
        if self.n_valid < n_counted:
            nan = torch.isnan(self.a) if mask is None else torch.isnan(self.a) & mask
            self.n_nan = int(torch.count_nonzero(nan))
            self.n_inf = n_counted - self.n_valid - self.n_nan
        self.n_zeroed = self.a.numel() - self.n_valid
        self.valid = valid if self.n_zeroed else None
        if self.n_zeroed:
            self.a.masked_fill_(~valid, 0)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def flat_index(self, idx: torch.Tensor) -> torch.Tensor:
        """Positions in ``a.view(-1)`` -> row-major flat indices into x (monotone, so orders are kept)."""
        if self.keep is None:
            return idx
        k = self.keep.numel()
        return torch.div(idx, k, rounding_mode="floor") * self.block + self.keep[idx % k]


def _trailing_block(mask: torch.Tensor, shape: tuple[int, ...]) -> int | None:
    """Size of the trailing dims a mask varies over, when it is constant over all leading dims of ``shape``
    and spans the trailing ones in full (e.g. (T, S) or (1, 1, T, S) for (B, H, T, S)); else None."""
    if mask.ndim > len(shape):
        return None
    mshape = (1,) * (len(shape) - mask.ndim) + tuple(mask.shape)
    j = next((i for i, m in enumerate(mshape) if m != 1), len(shape))
    if mshape[j:] != shape[j:]:
        return None
    return math.prod(shape[j:])


# ----------------------------------------------------------------------------------------------- top-k


def _round_down(t: float, dtype: torch.dtype) -> torch.Tensor:
    """Largest value of ``dtype`` <= t (t >= 0), so that ``a > result`` <=> ``a > t`` exactly."""
    r = torch.tensor(t, dtype=torch.float64).to(dtype)
    if float(r) > t:  # rounded up (or to inf): step one pattern down, valid for non-negative floats
        ity = _INT_OF_SIZE[r.element_size()]
        r = (r.view(ity) - 1).view(dtype)
    return r


def _sort_desc(vals: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order by value descending, then flat index ascending (indices are distinct)."""
    order = torch.argsort(idx)
    vals, idx = vals[order], idx[order]
    order = torch.sort(vals, descending=True, stable=True).indices
    return vals[order], idx[order]


def _spans(n: int):
    """(start, stop) of chunks that bound per-element temporaries: torch.topk on CPU allocates about
    3x its input, sum(dtype=float64) a float64 copy, binning an int32 copy."""
    return ((s, min(s + _CHUNK, n)) for s in range(0, n, _CHUNK))


def _above(flat: torch.Tensor, t: torch.Tensor, limit: int) -> torch.Tensor | None:
    """Ascending flat indices where flat > t, or None as soon as more than ``limit`` are found."""
    found, n = [], 0
    for start, stop in _spans(flat.numel()):
        hit = (flat[start:stop] > t).nonzero().squeeze(1) + start
        n += hit.numel()
        if n > limit:
            return None
        found.append(hit)
    return torch.cat(found) if found else flat.new_empty(0, dtype=torch.long)


def _first_equal(flat: torch.Tensor, t: torch.Tensor, r: int, valid: torch.Tensor | None) -> torch.Tensor:
    """The ``r`` lowest flat indices of counted entries equal to t."""
    found, need = [], r
    for start, stop in _spans(flat.numel()):
        if need == 0:
            break
        eq = flat[start:stop] == t
        if valid is not None:
            eq &= valid[start:stop]
        hit = eq.nonzero().squeeze(1)[:need] + start
        found.append(hit)
        need -= hit.numel()
    return torch.cat(found) if found else flat.new_empty(0, dtype=torch.long)


def _kth_largest(flat: torch.Tensor, kk: int) -> torch.Tensor:
    """The kk-th largest value (exact: the top kk of all lie among the chunks' top kk)."""
    best = [torch.topk(flat[a:b], min(kk, b - a), sorted=False).values for a, b in _spans(flat.numel())]
    return torch.topk(torch.cat(best), kk, sorted=False).values.min()


def _topk_exact(flat: torch.Tensor, kk: int, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic top-kk of the counted entries (kk <= their number), ordered as TopK keeps them.

    Everything above the kk-th value t goes in; among entries equal to t the lowest flat indices do
    (torch.topk's pick is unspecified). Entries above t are > 0, hence counted; zero ties need
    ``valid`` to skip the fill zeros.
    """
    t = _kth_largest(flat, kk)
    above = _above(flat, t, kk)
    valid = valid.view(-1) if valid is not None and t == 0 else None
    idx = torch.cat([above, _first_equal(flat, t, kk - above.numel(), valid)])
    return _sort_desc(flat[idx], idx)


def _unravel(idx: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if not shape:
        return torch.empty(idx.numel(), 0, dtype=torch.long)
    return torch.stack(torch.unravel_index(idx, shape), dim=1)


class TopK:
    """Exact top-k of |x| over a stream of updates.

    Keeps ``values`` (float64, descending; x's values converted losslessly), ``coords`` (LongTensor
    [m, ndim]: index within the x of its update), ``tags`` and ``calls`` (0-based update counter).
    Ties go to the earlier call, then the lower row-major flat index, so results are reproducible.
    All updates must have the same number of dimensions.
    """

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = int(k)
        self.n_calls = 0
        self.ndim: int | None = None
        self.values = torch.empty(0, dtype=torch.float64)
        self.coords = torch.empty(0, 0, dtype=torch.long)
        self.tags = torch.empty(0, dtype=torch.long)
        self.calls = torch.empty(0, dtype=torch.long)

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, tag: int = 0) -> None:
        self._ingest(_Prepared(x, mask), tag)

    def _ingest(self, p: _Prepared, tag: int) -> None:
        self._set_ndim(p.ndim)
        call = self.n_calls
        self.n_calls += 1
        if p.n_valid == 0:
            return
        vals, idx = self._candidates(p)
        m = vals.numel()
        if m:
            coords = _unravel(p.flat_index(idx).cpu(), p.shape)
            tags = torch.full((m,), int(tag), dtype=torch.long)
            self._absorb(vals.cpu().double(), coords, tags, torch.full((m,), call, dtype=torch.long))

    def _candidates(self, p: _Prepared) -> tuple[torch.Tensor, torch.Tensor]:
        flat = p.a.view(-1)
        if self.values.numel() == self.k:
            # Full: only entries strictly above the k-th kept value can enter (ties go to earlier calls).
            if p.amax is not None and p.amax <= float(self.values[-1]):
                return flat[:0], flat.new_empty(0, dtype=torch.long)
            t = _round_down(float(self.values[-1]), flat.dtype).to(flat.device)
            idx = _above(flat, t, 4 * self.k)  # > t >= 0: never a fill zero
            if idx is not None:  # cheap path, the common case once the stream has warmed up
                return _sort_desc(flat[idx], idx)
        return _topk_exact(flat, min(self.k, p.n_valid), p.valid)

    def _absorb(self, vals, coords, tags, calls) -> None:
        """Merge entries that all come after the kept ones in stream order."""
        vals = torch.cat([self.values, vals])
        order = torch.sort(vals, descending=True, stable=True).indices[: self.k]  # stable: earlier wins
        self.values = vals[order]
        self.coords = torch.cat([self.coords, coords])[order]
        self.tags = torch.cat([self.tags, tags])[order]
        self.calls = torch.cat([self.calls, calls])[order]

    def _set_ndim(self, ndim: int) -> None:
        if self.ndim is None:
            self.ndim = ndim
            self.coords = torch.empty(0, ndim, dtype=torch.long)
        elif ndim != self.ndim:
            raise ValueError(f"TopK saw {self.ndim}-d tensors before, now {ndim}-d")

    def merge(self, other: TopK) -> TopK:
        """Pool ``other`` in, as if its updates came after ours (its call indices are shifted)."""
        if other.k != self.k:
            raise ValueError(f"cannot merge TopK with k={other.k} into k={self.k}: not exact")
        if other.ndim is not None:
            self._set_ndim(other.ndim)
            self._absorb(other.values, other.coords, other.tags, other.calls + self.n_calls)
        self.n_calls += other.n_calls
        return self

    def result(self) -> dict:
        return {
            "values": self.values.tolist(),
            "coords": self.coords.tolist(),
            "tags": self.tags.tolist(),
            "calls": self.calls.tolist(),
        }

    def state_dict(self) -> dict:
        return {"k": self.k, "n_calls": self.n_calls, "ndim": self.ndim, **self.result()}

    @classmethod
    def from_state_dict(cls, d: dict) -> TopK:
        t = cls(d["k"])
        t.n_calls = d["n_calls"]
        if d["ndim"] is not None:
            t._set_ndim(d["ndim"])
            t.values = torch.tensor(d["values"], dtype=torch.float64)
            t.coords = torch.tensor(d["coords"], dtype=torch.long).reshape(-1, d["ndim"])
            t.tags = torch.tensor(d["tags"], dtype=torch.long)
            t.calls = torch.tensor(d["calls"], dtype=torch.long)
        return t


# ------------------------------------------------------------------------------------------- quantiles


def _bins(vals: torch.Tensor, mode: str) -> torch.Tensor:
    """Bin of each finite non-negative value; bins are monotone in the value.

    fp16 / bf16: the 16-bit pattern itself (one bin per value, exact). fp32: the float32 pattern
    shifted right by 12. Any 16-bit value sits exactly on a lower edge of an fp32 bin, so such data
    stays exact in fp32 mode. float64 is rounded to float32 (monotone, clamped to the float32 range).
    """
    if mode in _MODE_DTYPE:
        if vals.dtype != _MODE_DTYPE[mode]:
            raise ValueError(f"{vals.dtype} data cannot be binned in a {mode} histogram")
        return vals.view(torch.int16)  # patterns of |x| are >= 0
    if vals.dtype == torch.float64:
        vals = vals.clamp(max=_F32_MAX)
    return vals.to(torch.float32).view(torch.int32) >> _SHIFT32


def _bin_value(b: int, mode: str) -> float:
    """Value reported for bin ``b``: the exact value (16-bit) or the bin's lower edge (fp32).

    The lower edge is exact for all 16-bit data and a guaranteed lower bound otherwise, with relative
    error < 2**-11 for normal floats (absolute < 2**-137 for float32 subnormals).
    """
    if mode == "fp32":
        return torch.tensor(b << _SHIFT32, dtype=torch.int32).view(torch.float32).item()
    return torch.tensor(b, dtype=torch.int16).view(_MODE_DTYPE[mode]).item()


def _hist_to_fp32(hist: torch.Tensor, mode: str) -> torch.Tensor:
    """Re-bin a 16-bit-pattern histogram into fp32 bins (exact: see _bins)."""
    nz = hist.nonzero().squeeze(1)
    vals = nz.to(torch.int16).view(_MODE_DTYPE[mode])
    out = torch.zeros(_NBINS["fp32"], dtype=torch.long)
    return out.index_add_(0, _bins(vals, "fp32").long(), hist[nz])


class Quantiles:
    """Histogram of |x| bit patterns: exact quantiles for fp16 / bf16, < 2**-11 relative for fp32.

    The mode is set by the first dtype seen ("fp16", "bf16": 2**15 bins; anything else "fp32":
    2**19 bins, 4 MiB). Mixing dtypes re-bins into fp32 mode, which keeps 16-bit data exact.
    ``exact`` tells whether reported quantiles are exact; ``exact_pass()`` makes them exact otherwise.
    """

    def __init__(self):
        self.mode: str | None = None
        self.hist: torch.Tensor | None = None
        self.count = 0
        self.lossy = False  # float32 / float64 data were binned

    @property
    def exact(self) -> bool:
        return not self.lossy

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, tag: int = 0) -> None:
        self._ingest(_Prepared(x, mask))

    def _ingest(self, p: _Prepared) -> None:
        if p.n_valid == 0:
            return
        self._adopt(_HALF_MODES.get(p.dtype, "fp32"))
        self.lossy |= p.dtype not in _HALF_MODES
        flat, nbins = p.a.view(-1), _NBINS[self.mode]
        counts = torch.zeros(nbins, dtype=torch.long, device=flat.device)
        for start, stop in _spans(flat.numel()):  # chunks bound the int32 bin temporaries
            counts += torch.bincount(_bins(flat[start:stop], self.mode), minlength=nbins)
        counts = counts.cpu()
        counts[0] -= p.n_zeroed  # the fill zeros of entries that do not count
        self.hist += counts
        self.count += p.n_valid

    def _adopt(self, mode: str) -> None:
        """Make the histogram able to take data of ``mode``."""
        if self.mode is None:
            self.mode, self.hist = mode, torch.zeros(_NBINS[mode], dtype=torch.long)
        elif self.mode != mode and self.mode != "fp32":
            log.debug("histogram: re-binning %s into fp32 bins", self.mode)
            self.hist, self.mode = _hist_to_fp32(self.hist, self.mode), "fp32"

    def merge(self, other: Quantiles) -> Quantiles:
        if other.count == 0:
            return self
        self._adopt(other.mode)
        hist = other.hist if other.mode == self.mode else _hist_to_fp32(other.hist, other.mode)
        self.hist = self.hist + hist
        self.count += other.count
        self.lossy |= other.lossy
        return self

    def _locate(self, qs: Iterable[float]) -> dict[float, tuple[int, int]]:
        """For each q: (bin holding its rank, rank within that bin)."""
        cs = self.hist.cumsum(0)
        out = {}
        for q in qs:
            r = quantile_rank(q, self.count)
            b = int(torch.searchsorted(cs, r, right=True))
            out[q] = (b, r - int(cs[b] - self.hist[b]))
        return out

    def quantiles(self, qs: Iterable[float] = DEFAULT_QUANTILES) -> dict[float, float | None]:
        qs = list(qs)
        if self.count == 0:
            return {q: None for q in qs}
        return {q: _bin_value(b, self.mode) for q, (b, _) in self._locate(qs).items()}

    def quantile(self, q: float) -> float | None:
        return self.quantiles([q])[q]

    def median(self) -> float | None:
        """Lower median (rank (n-1)//2), as torch.median."""
        return self.quantile(0.5)

    def log2_histogram(self) -> dict:
        """Counts of |x| per octave [2**e, 2**(e+1)) (exact: bins never straddle a power of two), for plots."""
        if self.count == 0:
            return {"zero": 0, "exponents": [], "counts": []}
        nz = self.hist.nonzero().squeeze(1)
        if self.mode == "fp32":
            edges = (nz.to(torch.int32) << _SHIFT32).view(torch.float32)
        else:
            edges = nz.to(torch.int16).view(_MODE_DTYPE[self.mode]).float()
        counts = self.hist[nz]
        positive = edges > 0
        exps = torch.floor(torch.log2(edges[positive].double())).long()
        uniq, inverse = torch.unique(exps, return_inverse=True)
        per_octave = torch.zeros(len(uniq), dtype=torch.long).index_add_(0, inverse, counts[positive])
        return {"zero": int(counts[~positive].sum()), "exponents": uniq.tolist(), "counts": per_octave.tolist()}

    def exact_pass(self, qs: Iterable[float] = (0.5,)) -> ExactPass:
        """A helper that, fed the same data again, returns the exact quantiles."""
        return ExactPass(self, qs)

    def result(self, qs: Iterable[float] = DEFAULT_QUANTILES) -> dict:
        return {
            "count": self.count,
            "exact": self.exact,
            "quantiles": {str(q): v for q, v in self.quantiles(qs).items()},
        }

    def state_dict(self) -> dict:
        """Sparse: only non-empty bins."""
        nz = [] if self.hist is None else self.hist.nonzero().squeeze(1).tolist()
        counts = [] if self.hist is None else self.hist[nz].tolist()
        return {"mode": self.mode, "lossy": self.lossy, "bins": nz, "counts": counts}

    @classmethod
    def from_state_dict(cls, d: dict) -> Quantiles:
        h = cls()
        if d["mode"] is not None:
            h._adopt(d["mode"])
            h.hist[torch.tensor(d["bins"], dtype=torch.long)] = torch.tensor(d["counts"], dtype=torch.long)
            h.count = int(h.hist.sum())
        h.lossy = d["lossy"]
        return h


class ExactPass:
    """Second pass for exact quantiles: keeps only the values falling in the bins of the wanted ranks.

    A float32 bin holds at most 2**12 distinct values and the kept values are deduplicated as they
    arrive, so memory stays bounded. ``result()`` checks that the pass saw the same data.
    """

    def __init__(self, hist: Quantiles, qs: Iterable[float] = (0.5,)):
        self.qs = tuple(qs)
        self.mode = hist.mode
        self.n_expected = hist.count
        self.n_seen = 0
        self._where = hist._locate(self.qs) if hist.count else {}
        bins = sorted({b for b, _ in self._where.values()})
        self._expected = {b: int(hist.hist[b]) for b in bins}
        self._kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {b: _empty_kept() for b in bins}
        self._pending: dict[int, list[torch.Tensor]] = {b: [] for b in bins}

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, tag: int = 0) -> None:
        self._ingest(_Prepared(x, mask))

    def _ingest(self, p: _Prepared) -> None:
        if p.n_valid == 0:
            return
        self.n_seen += p.n_valid
        if not self._expected:
            return
        flat = p.a.view(-1)
        valid = None if p.valid is None else p.valid.view(-1)
        for start, stop in _spans(flat.numel()):
            part = flat[start:stop]
            bins = _bins(part, self.mode)
            for b in self._expected:
                hit = bins == b
                if valid is not None:
                    hit &= valid[start:stop]
                self._keep(b, part[hit].cpu().double())

    def _keep(self, b: int, vals: torch.Tensor) -> None:
        self._pending[b].append(vals)
        if sum(v.numel() for v in self._pending[b]) >= _COMPACT_AT:
            self._compact(b)

    def _compact(self, b: int) -> None:
        """Fold pending values of bin ``b`` into sorted distinct values with counts."""
        pend = self._pending[b]
        self._pending[b] = []
        self._fold(b, torch.cat(pend) if pend else _empty_kept()[0],
                   torch.ones(sum(v.numel() for v in pend), dtype=torch.long))

    def _fold(self, b: int, vals: torch.Tensor, counts: torch.Tensor) -> None:
        kept_v, kept_c = self._kept[b]
        uniq, inv = torch.unique(torch.cat([kept_v, vals]), sorted=True, return_inverse=True)
        counts = torch.zeros(uniq.numel(), dtype=torch.long).index_add_(0, inv, torch.cat([kept_c, counts]))
        self._kept[b] = uniq, counts

    def merge(self, other: ExactPass) -> ExactPass:
        """Pool a pass of the same histogram over other data (another shard of the stream): order-free."""
        if self._expected.keys() != other._expected.keys() or self.n_expected != other.n_expected:
            raise ValueError("cannot merge exact passes of different histograms")
        self.n_seen += other.n_seen
        for b in self._expected:
            other._compact(b)
            self._fold(b, *other._kept[b])
        return self

    def result(self) -> dict[float, float | None]:
        if self.n_seen != self.n_expected:
            raise ValueError(f"exact pass saw {self.n_seen} values, the histogram {self.n_expected}")
        out = {}
        for q in self.qs:
            if not self._where:
                out[q] = None
                continue
            b, j = self._where[q]
            self._compact(b)
            vals, counts = self._kept[b]
            cs = counts.cumsum(0)
            if int(cs[-1]) != self._expected[b]:
                raise ValueError("exact pass saw different data than the histogram")
            out[q] = float(vals[int(torch.searchsorted(cs, j, right=True))])
        return out


def _empty_kept() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.long)


# --------------------------------------------------------------------------------------------- moments


def _sum_abs(p: _Prepared) -> float:
    """Sum of ``p.a`` (fill zeros add nothing): float32 sums of _SUM_BLOCK values, added in float64, so the
    relative error stays below ~1e-6 (all terms are >= 0) at a fraction of a float64 pass; float64 data and
    values large enough to overflow a float32 block sum go the float64 way, in chunks (no float64 copy)."""
    flat = p.a.view(-1)
    n = flat.numel()
    if flat.dtype == torch.float64 or p.amax is None or p.amax * _SUM_BLOCK >= _F32_MAX:
        return float(sum(flat[a:b].sum(dtype=torch.float64) for a, b in _spans(n)))
    whole = n - n % _SUM_BLOCK
    blocks = flat[:whole].view(-1, _SUM_BLOCK).sum(1, dtype=torch.float32).double().sum()
    return float(blocks + flat[whole:].sum(dtype=torch.float64))


class ExactSum:
    """A float sum that does not depend on the order of its terms: exact partials (Shewchuk, as ``math.fsum``),
    rounded once when read. Shards of a stream summed on different processes merge to the very float a single
    sequential pass gives, which a plain running ``+=`` cannot promise."""

    def __init__(self, partials: Iterable[float] = ()):
        self.partials: list[float] = []
        self.special = 0.0  # ±Inf / NaN terms: kept apart, they would poison the exact partials
        for x in partials:
            self.add(x)

    def add(self, x: float) -> None:
        x = float(x)
        if not math.isfinite(x):
            self.special += x
            return
        kept = []
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                kept.append(lo)
            x = hi
        if math.isfinite(x):
            self.partials = [*kept, x]
        else:  # the exact partials overflowed: the sum is ±Inf whatever comes later
            self.partials, self.special = [], self.special + x

    def merge(self, other: ExactSum) -> ExactSum:
        for x in other.partials:
            self.add(x)
        self.special += other.special
        return self

    @property
    def value(self) -> float:
        return math.fsum(self.partials) + self.special if self.special else math.fsum(self.partials)

    def state(self) -> list[float]:
        return [*self.partials, self.special] if self.special else list(self.partials)


class Moments:
    """Count of counted finite entries, mean |x| (relative error < ~1e-6), max |x|, NaN and ±Inf counts.

    The per-update sums are added exactly (:class:`ExactSum`), so merging shards in any order reproduces the
    single-pass mean bit for bit."""

    def __init__(self):
        self.count = 0
        self._sum = ExactSum()
        self.max: float | None = None
        self.nan = 0
        self.inf = 0

    @property
    def sum(self) -> float:
        return self._sum.value

    @property
    def mean_abs(self) -> float | None:
        return self.sum / self.count if self.count else None

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, tag: int = 0) -> None:
        self._ingest(_Prepared(x, mask))

    def _ingest(self, p: _Prepared) -> None:
        self.nan += p.n_nan
        self.inf += p.n_inf
        if p.n_valid == 0:
            return
        self.count += p.n_valid
        self._sum.add(_sum_abs(p))
        self._take_max(p.amax if p.amax is not None else float(p.a.max()))

    def _take_max(self, m: float | None) -> None:
        if m is not None:
            self.max = m if self.max is None else max(self.max, m)

    def merge(self, other: Moments) -> Moments:
        self.count += other.count
        self._sum.merge(other._sum)
        self.nan += other.nan
        self.inf += other.inf
        self._take_max(other.max)
        return self

    def result(self) -> dict:
        return {
            "count": self.count,
            "mean_abs": self.mean_abs,
            "max": self.max,
            "nan": self.nan,
            "inf": self.inf,
        }

    def state_dict(self) -> dict:
        return {"count": self.count, "sum": self.sum, "sum_partials": self._sum.state(), "max": self.max,
                "nan": self.nan, "inf": self.inf}

    @classmethod
    def from_state_dict(cls, d: dict) -> Moments:
        m = cls()
        m.count, m.max, m.nan, m.inf = d["count"], d["max"], d["nan"], d["inf"]
        m._sum = ExactSum(d.get("sum_partials", [d["sum"]]))
        return m


# ------------------------------------------------------------------------------------------- kurtosis


KURTOSIS_EPS = 1e-6


def row_kurtosis(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Kurtosis of each vector along ``dim`` in float64, as Bondarenko et al. (arXiv 2306.12929) measure
    outliers: E[(x − μ)⁴] / (s⁴ + 1e-6) with s the unbiased standard deviation (their utils.kurtosis)."""
    x = x.double()
    d2 = (x - x.mean(dim, keepdim=True)).square_()  # squared deviations, reused for s² and the 4th moment
    var = d2.sum(dim) / (x.shape[dim] - 1)  # s², unbiased
    return d2.square_().mean(dim) / (var.square() + KURTOSIS_EPS)


class Kurtosis:
    """Mean and max over vectors (e.g. each token's hidden state across channels) of their kurtosis, streamed:
    float64 sums, so the mean equals the one-shot computation up to float64 rounding. Vectors holding NaN or
    Inf are skipped (the NaN / Inf counts report them)."""

    def __init__(self, dim: int = -1):
        self.dim = dim
        self.count = 0
        self._sum = ExactSum()  # order-free, so merged shards equal one pass
        self.max: float | None = None

    @property
    def sum(self) -> float:
        return self._sum.value

    def update(self, x: torch.Tensor) -> None:
        if x.ndim == 0 or x.numel() == 0 or x.shape[self.dim] < 2:
            return
        k = row_kurtosis(x, self.dim).reshape(-1)
        k = k[torch.isfinite(k)]
        if k.numel():
            self.count += k.numel()
            self._sum.add(float(k.sum()))
            self._take_max(float(k.max()))

    def _take_max(self, m: float | None) -> None:
        if m is not None:
            self.max = m if self.max is None else max(self.max, m)

    def merge(self, other: Kurtosis) -> Kurtosis:
        self.count += other.count
        self._sum.merge(other._sum)
        self._take_max(other.max)
        return self

    def result(self) -> dict:
        return {"mean": self.sum / self.count if self.count else None, "max": self.max, "vectors": self.count}

    def state_dict(self) -> dict:
        return {"dim": self.dim, "count": self.count, "sum": self.sum, "sum_partials": self._sum.state(),
                "max": self.max}

    @classmethod
    def from_state_dict(cls, d: dict) -> Kurtosis:
        k = cls(d["dim"])
        k.count, k.max = d["count"], d["max"]
        k._sum = ExactSum(d.get("sum_partials", [d["sum"]]))
        return k


# ---------------------------------------------------------------------------------------- channel max


class ChannelMax:
    """Per-channel max |x| along ``dim`` over all other dims (finite, counted entries only).

    The channel count may grow between updates (e.g. key positions); channels never seen report None.
    """

    def __init__(self, dim: int = -1):
        self.dim = dim
        self.max = torch.empty(0, dtype=torch.float64)  # -1 marks a channel with no counted entry

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, tag: int = 0) -> None:
        self._ingest(_Prepared(x, mask, compact=False))

    def _ingest(self, p: _Prepared) -> None:
        if p.ndim == 0:
            raise ValueError("ChannelMax needs at least one dimension")
        if p.n_valid == 0:
            return
        d = self.dim % p.ndim
        others = [i for i in range(p.ndim) if i != d]
        m = p.a.amax(dim=others) if others else p.a.clone()
        if p.valid is not None:  # a fill zero is not a seen value
            m[~(p.valid.any(dim=others) if others else p.valid)] = -1
        self._take(m.cpu().double())

    def _take(self, m: torch.Tensor) -> None:
        if m.numel() > self.max.numel():
            pad = torch.full((m.numel() - self.max.numel(),), -1.0, dtype=torch.float64)
            self.max = torch.cat([self.max, pad])
        self.max[: m.numel()] = torch.maximum(self.max[: m.numel()], m)

    def merge(self, other: ChannelMax) -> ChannelMax:
        self._take(other.max)
        return self

    def top_channels(self, n: int = 10) -> list[tuple[int, float]]:
        """The ``n`` channels with the largest max |x|, descending; ties to the lower channel."""
        order = torch.sort(self.max, descending=True, stable=True).indices[:n]
        return [(int(c), float(self.max[c])) for c in order if self.max[c] >= 0]

    def result(self, n: int = 10) -> dict:
        return {
            "dim": self.dim,
            "max": [v if v >= 0 else None for v in self.max.tolist()],
            "top": [list(t) for t in self.top_channels(n)],
        }

    def state_dict(self) -> dict:
        return {"dim": self.dim, "max": self.max.tolist()}

    @classmethod
    def from_state_dict(cls, d: dict) -> ChannelMax:
        c = cls(d["dim"])
        c.max = torch.tensor(d["max"], dtype=torch.float64)
        return c


# ------------------------------------------------------------------------------------------ site stats


class SiteStats:
    """TopK + Quantiles + Moments (+ ChannelMax) over one stream, with |x| computed once per update.

    With ``exact_median=True`` and non-16-bit data, ``needs_exact_pass`` is True: call
    ``exact_pass()`` and feed it the same data again; ``result()`` then reports exact quantiles.
    """

    def __init__(
        self,
        topk: int = 100,
        exact_median: bool = False,
        channel_dim: int | None = None,
        quantiles: Iterable[float] = DEFAULT_QUANTILES,
    ):
        self.topk = TopK(topk)
        self.hist = Quantiles()
        self.moments = Moments()
        self.channels = None if channel_dim is None else ChannelMax(channel_dim)
        self.kurtosis = None if channel_dim is None else Kurtosis(channel_dim)
        self.exact_median = exact_median
        self.qs = tuple(sorted(set(quantiles) | {0.5}))
        self._exact: ExactPass | None = None

    def _parts(self):
        return [r for r in (self.hist, self.moments, self.channels) if r is not None]

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, tag: int = 0) -> None:
        p = _Prepared(x, mask, compact=self.channels is None)  # per-channel maxima need x's shape
        self.topk._ingest(p, tag)
        for r in self._parts():
            r._ingest(p)
        if self.kurtosis is not None:
            self.kurtosis.update(x.detach())
        self._exact = None  # new data: an earlier exact pass no longer applies

    @property
    def needs_exact_pass(self) -> bool:
        return self.exact_median and not self.hist.exact and self._exact is None

    def exact_pass(self) -> ExactPass:
        """Start a second pass; feed it the same updates (x, mask) before calling ``result()``."""
        self._exact = self.hist.exact_pass(self.qs)
        return self._exact

    def merge(self, other: SiteStats) -> SiteStats:
        self.topk.merge(other.topk)
        self.hist.merge(other.hist)
        self.moments.merge(other.moments)
        if self.channels is not None and other.channels is not None:
            self.channels.merge(other.channels)
        if self.kurtosis is not None and other.kurtosis is not None:
            self.kurtosis.merge(other.kurtosis)
        self._exact = None
        return self

    def _quantile_values(self) -> tuple[dict, bool]:
        if self._exact is not None:
            return self._exact.result(), True
        if self.exact_median and not self.hist.exact:
            log.warning("exact median asked for but no exact pass was run; reporting histogram values")
        return self.hist.quantiles(self.qs), self.hist.exact

    def result(self) -> dict:
        qv, exact = self._quantile_values()
        top = self.topk.result()
        out = {
            **self.moments.result(),
            "median": qv[0.5],
            "quantiles": {str(q): v for q, v in qv.items()},
            "quantiles_exact": exact,
            "top": top["values"],
            "top_coords": top["coords"],
            "top_tags": top["tags"],
            "top_calls": top["calls"],
            "calls": self.topk.n_calls,
        }
        if self.channels is not None:
            out["channels"] = self.channels.result()
        if self.kurtosis is not None:
            out["kurtosis"] = self.kurtosis.result()
        return out

    def state_dict(self) -> dict:
        return {
            "exact_median": self.exact_median,
            "quantiles": list(self.qs),
            "topk": self.topk.state_dict(),
            "hist": self.hist.state_dict(),
            "moments": self.moments.state_dict(),
            "channels": None if self.channels is None else self.channels.state_dict(),
            "kurtosis": None if self.kurtosis is None else self.kurtosis.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, d: dict) -> SiteStats:
        s = cls(d["topk"]["k"], d["exact_median"], quantiles=d["quantiles"])
        s.topk = TopK.from_state_dict(d["topk"])
        s.hist = Quantiles.from_state_dict(d["hist"])
        s.moments = Moments.from_state_dict(d["moments"])
        s.channels = None if d["channels"] is None else ChannelMax.from_state_dict(d["channels"])
        s.kurtosis = None if d.get("kurtosis") is None else Kurtosis.from_state_dict(d["kurtosis"])
        return s
