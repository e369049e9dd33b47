"""Paired statistics of two evaluations on the same items or windows (pure: numpy only, no torch, no model).

Items (0/1 correctness, log-likelihoods) and perplexity windows (``[sum nats, tokens]``) are resampled jointly
in both results: percentile bootstrap intervals of a change (:func:`paired_bootstrap`,
:func:`paired_bootstrap_ppl`) and of a difference of changes (:func:`difference_of_degradations`), the exact
McNemar test (:func:`mcnemar_exact`) and a perplexity's own interval (:func:`bootstrap_ppl_ci`).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np


def paired_arrays(result_a: dict, result_b: dict, key: str = "correct") -> tuple[np.ndarray, np.ndarray]:
    """Per-item ``key`` of two task results aligned by item id (they must hold the same items)."""
    a = {r["id"]: r[key] for r in result_a["items"]}
    b = {r["id"]: r[key] for r in result_b["items"]}
    if a.keys() != b.keys():
        raise ValueError(f"results do not pair: {len(a.keys() ^ b.keys())} item ids differ")
    ids = sorted(a)
    return np.array([a[i] for i in ids], dtype=np.float64), np.array([b[i] for i in ids], dtype=np.float64)


CHUNK_DRAWS = 2_000_000  # indices drawn at once: the memory of one chunk, whatever n and m
COUNT_CACHE_BYTES = 256 << 20  # resample counts kept for the next statistic over the same (seed, m, n)
PROGRESS_DRAWS = 50_000_000  # a bootstrap drawing more indices than this shows a progress bar


def bootstrap_sums(vectors: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Column sums of ``vectors`` (m units, p columns) over ``n`` bootstrap resamples of its rows: (n, p).

    Every statistic here is a function of such sums (means, ratios of sums), so a resample is its count vector
    (how often each unit was drawn) and all sums of a chunk are one matrix product. The resamples depend only on
    (seed, m, n) — the same draws as indexing with ``rng.integers(0, m, (k, m))`` chunk by chunk — and a report
    asks for many statistics over the same units (every bit width and comparison of a task), so the last set of
    counts is kept (one byte per count while it fits in :data:`COUNT_CACHE_BYTES`) and reused instead of drawn
    again. Larger sets are streamed, with a progress bar when long."""
    if n < 1:
        raise ValueError(f"the number of bootstrap resamples must be positive, got {n}")
    vectors = np.asarray(vectors, dtype=np.float64)
    m = vectors.shape[0]
    out = np.empty((n, vectors.shape[1]))
    if n * m <= COUNT_CACHE_BYTES:
        counts = _kept_counts(seed, m, n)
        chunk = max(1, CHUNK_DRAWS // m)
        for s in range(0, n, chunk):
            out[s:s + chunk] = counts[s:s + chunk].astype(np.float64) @ vectors
        return out
    from .progress import progress_bar  # lazy: only long bootstraps need it

    with progress_bar(total=n, desc=f"bootstrap ({m} units)", unit="resample", leave=False,
              disable=n * m < PROGRESS_DRAWS) as bar:
        for s, counts in _counts(seed, m, n):
            out[s:s + len(counts)] = counts @ vectors
            bar.update(len(counts))
    return out


def _counts(seed: int, m: int, n: int):
    """(first resample, float64 counts (k, m)) chunk by chunk."""
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_DRAWS // m)
    for s in range(0, n, chunk):
        idx = rng.integers(0, m, size=(min(chunk, n - s), m))
        flat = (idx + m * np.arange(len(idx))[:, None]).ravel()
        yield s, np.bincount(flat, minlength=idx.size).reshape(idx.shape).astype(np.float64)


@functools.lru_cache(maxsize=1)
def _kept_counts(seed: int, m: int, n: int) -> np.ndarray:
    """All ``n`` count vectors of :func:`_counts` as uint8 (a unit drawn over 255 times in one resample of m is
    beyond any practical m; checked)."""
    out = np.empty((n, m), dtype=np.uint8)
    for s, counts in _counts(seed, m, n):
        if counts.max() > 255:
            raise ValueError(f"a bootstrap resample drew one of {m} units {int(counts.max())} times")
        out[s:s + len(counts)] = counts
    out.flags.writeable = False
    return out


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _vectors(*arrays, names: str) -> list[np.ndarray]:
    out = [np.asarray(a, dtype=np.float64).ravel() for a in arrays]
    if len({a.size for a in out}) != 1:
        raise ValueError(f"{names} must have the same length, got {[a.size for a in out]}")
    if out[0].size == 0:
        raise ValueError(f"{names} are empty")
    return out


def paired_bootstrap(a, b, n: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of ``b`` minus mean of ``a`` (e.g. quantized minus baseline accuracy, per-item 0/1 arrays on the
    same items) with a paired percentile bootstrap interval (items resampled, both arrays together)."""
    a, b = _vectors(a, b, names="a and b")
    d = b - a
    values = bootstrap_sums(d[:, None], n, seed)[:, 0] / d.size
    low, high = _interval(values, level)
    return {"delta": float(d.mean()), "low": low, "high": high, "level": level, "n_items": int(d.size),
            "n_boot": n}


def discordant_counts(a, b) -> tuple[int, int]:
    """(items only ``a`` gets right, items only ``b`` gets right) of two per-item correctness arrays."""
    a, b = (x.astype(bool) for x in _vectors(a, b, names="a and b"))
    return int((a & ~b).sum()), int((b & ~a).sum())


def mcnemar_exact(a, b) -> float:
    """Exact two-sided McNemar p-value: a binomial test (p = 1/2) on the discordant pairs.

    Equals ``scipy.stats.binomtest(only_b, only_a + only_b, 0.5).pvalue``; computed with exact integers:
    ``min(1, 2·P(X ≤ min(only_a, only_b)))``; 1.0 when no item is discordant.
    """
    only_a, only_b = discordant_counts(a, b)
    total = only_a + only_b
    if total == 0:
        return 1.0
    tail = sum(math.comb(total, i) for i in range(min(only_a, only_b) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2 ** total)))


def _windows(window_losses) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(window_losses, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != 2 or w.shape[0] == 0:
        raise ValueError("window_losses must be a non-empty list of [sum nats, tokens] pairs")
    return w[:, 0], w[:, 1]


def bootstrap_ppl_ci(window_losses, n: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Perplexity with a percentile bootstrap interval, windows resampled (``exp(Σ nats / Σ tokens)``)."""
    nll, tokens = _windows(window_losses)
    sums = bootstrap_sums(np.stack([nll, tokens], 1), n, seed)
    values = np.exp(sums[:, 0] / sums[:, 1])
    low, high = _interval(values, level)
    return {"perplexity": float(np.exp(nll.sum() / tokens.sum())), "low": low, "high": high, "level": level,
            "n_windows": int(nll.size), "n_boot": n}


def paired_bootstrap_ppl(windows_a, windows_b, n: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Perplexity of ``b`` minus that of ``a`` on the same windows (same text and tokenizer), windows
    resampled jointly."""
    nll_a, tok_a = _windows(windows_a)
    nll_b, tok_b = _windows(windows_b)
    if tok_a.shape != tok_b.shape or not np.array_equal(tok_a, tok_b):
        raise ValueError("window losses do not pair: different windows (text, tokenizer or max_len differ)")

    t, sa, sb = bootstrap_sums(np.stack([tok_a, nll_a, nll_b], 1), n, seed).T
    values = np.exp(sb / t) - np.exp(sa / t)
    low, high = _interval(values, level)
    ppl_a, ppl_b = (float(np.exp(x.sum() / tok_a.sum())) for x in (nll_a, nll_b))
    return {"perplexity_a": ppl_a, "perplexity_b": ppl_b, "delta": ppl_b - ppl_a, "low": low, "high": high,
            "level": level, "n_windows": int(nll_a.size), "n_boot": n}


def difference_of_degradations(base_a, quant_a, base_b, quant_b, n: int = 10000, seed: int = 0,
                               level: float = 0.95) -> dict:
    """``(mean quant_b − mean base_b) − (mean quant_a − mean base_a)`` with a paired bootstrap interval.

    Four per-item arrays on the same items (e.g. a = Transformer, b = Diff, 0/1 correctness at 16 bits and
    quantized); items are resampled jointly in all four. ``delta_a``/``delta_b`` are each model's change from
    its baseline (negative = it lost accuracy); a positive ``difference`` means b degraded less than a.
    """
    base_a, quant_a, base_b, quant_b = _vectors(base_a, quant_a, base_b, quant_b,
                                                names="base_a, quant_a, base_b and quant_b")
    da, db = quant_a - base_a, quant_b - base_b
    diff = db - da
    values = bootstrap_sums(diff[:, None], n, seed)[:, 0] / diff.size
    low, high = _interval(values, level)
    return {"delta_a": float(da.mean()), "delta_b": float(db.mean()), "difference": float(diff.mean()),
            "low": low, "high": high, "level": level, "n_items": int(diff.size), "n_boot": n}
