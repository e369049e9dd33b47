"""Paired statistics of two evaluations on the same items or windows (pure: numpy only, no torch, no model).

Items (0/1 correctness, log-likelihoods) and perplexity windows (``[sum nats, tokens]``) are resampled jointly
in both results: percentile bootstrap intervals of a change (:func:`paired_bootstrap`,
:func:`paired_bootstrap_ppl`) and of a difference of changes (:func:`difference_of_degradations`), the exact
McNemar test (:func:`mcnemar_exact`) and a perplexity's own interval (:func:`bootstrap_ppl_ci`). Each interval
also comes as a :class:`Plan` (``*_plan``): :func:`resample` computes many of them over one set of resamples.

Why not ``scipy.stats.bootstrap``: given our generator and batch (``CHUNK_DRAWS // m``) it draws exactly these
resamples and gives the same intervals to rounding (tests/test_evaluate.py), and for one statistic it is as fast.
But it resamples the data for each statistic separately, while a report asks for hundreds over the same items:
48 accuracy intervals over 10,042 items take 47.9 CPU s there, 1.25 s here (experiments/bench_scipy_stats.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .record_arrays import column_by_id


def paired_arrays(result_a: dict, result_b: dict, key: str = "correct") -> tuple[np.ndarray, np.ndarray]:
    """Per-item ``key`` of two task results aligned by item id (they must hold the same items)."""
    columns = column_by_id(result_a["items"], key), column_by_id(result_b["items"], key)
    if None not in columns:
        return _aligned(*columns)
    a = {r["id"]: r[key] for r in result_a["items"]}
    b = {r["id"]: r[key] for r in result_b["items"]}
    if a.keys() != b.keys():
        raise ValueError(f"results do not pair: {len(a.keys() ^ b.keys())} item ids differ")
    ids = sorted(a)
    return np.array([a[i] for i in ids], dtype=np.float64), np.array([b[i] for i in ids], dtype=np.float64)


def _aligned(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`paired_arrays` on (unique ids, values) arrays."""
    (ids_a, values_a), (ids_b, values_b) = a, b
    order_a, order_b = np.argsort(ids_a, kind="stable"), np.argsort(ids_b, kind="stable")
    if ids_a.size != ids_b.size or not np.array_equal(ids_a[order_a], ids_b[order_b]):
        raise ValueError(f"results do not pair: {np.setxor1d(ids_a, ids_b).size} item ids differ")
    return values_a[order_a].astype(np.float64), values_b[order_b].astype(np.float64)


CHUNK_DRAWS = 2_000_000  # indices drawn at once: the memory of one chunk, whatever n and m
SUMS_BYTES = 64 << 20  # bootstrap sums held at once (n resamples × columns, float64)
PROGRESS_DRAWS = 50_000_000  # resampling that draws more indices than this shows a progress bar


@dataclass(frozen=True)
class Plan:
    """A bootstrap statistic before resampling: the columns it sums over each resample (m units × p) and what it
    makes of those sums ((n, p) -> its result)."""

    vectors: np.ndarray
    finish: Callable[[np.ndarray], dict]


def resample(plans: Sequence[Plan], n: int, seed: int) -> list[dict]:
    """The result of each plan over ``n`` bootstrap resamples of its units.

    A resample is its count vector (how often each unit was drawn) and depends only on (seed, m, n), the same
    draws as indexing with ``rng.integers(0, m, (k, m))`` chunk by chunk; every statistic here is a function of
    column sums, so a resample's sums are one matrix product. Plans over the same number of units share their
    resamples: each chunk of counts is drawn once and multiplied by all their columns at once (identical columns
    once), so a report's hundreds of intervals over one task cost one pass over its resamples, not one each."""
    if n < 1:
        raise ValueError(f"the number of bootstrap resamples must be positive, got {n}")
    vectors = [np.asarray(p.vectors, dtype=np.float64).reshape(len(p.vectors), -1) for p in plans]
    by_units: dict[int, list[int]] = {}
    for i, v in enumerate(vectors):
        by_units.setdefault(v.shape[0], []).append(i)
    groups = [(members, *_distinct_columns([vectors[i] for i in members])) for members in by_units.values()]
    width = max(1, SUMS_BYTES // (8 * n))  # more columns than this: one pass over the resamples per block
    draws = sum(n * table.shape[0] * -(-table.shape[1] // width) for _, table, _ in groups)
    results: list[dict | None] = [None] * len(plans)
    from .progress import progress_bar  # lazy: only long resampling shows one

    with progress_bar(total=draws, desc="bootstrap", unit="draw", unit_scale=True, leave=False,
                      disable=draws < PROGRESS_DRAWS) as bar:
        for members, table, where in groups:
            sums = _column_sums(table, n, seed, width, bar)
            for i, w in zip(members, where, strict=True):
                results[i] = plans[i].finish(sums[:, w])
    return results


def _distinct_columns(vectors: list[np.ndarray]) -> tuple[np.ndarray, list[list[int]]]:
    """The distinct columns of (m, p) arrays as one (m, P) table, and where each array's columns are in it."""
    columns: dict[bytes, int] = {}
    where = [[columns.setdefault(np.ascontiguousarray(c).tobytes(), len(columns)) for c in v.T] for v in vectors]
    return np.stack([np.frombuffer(c) for c in columns], axis=1), where


def _column_sums(table: np.ndarray, n: int, seed: int, width: int, bar) -> np.ndarray:
    """Sums (n, P) of the table's columns over the n resamples of its m rows, ``width`` columns per pass."""
    sums = np.empty((n, table.shape[1]))
    for first in range(0, table.shape[1], width):
        block = np.ascontiguousarray(table[:, first:first + width])
        for s, counts in _counts(seed, table.shape[0], n):
            sums[s:s + len(counts), first:first + width] = counts @ block
            bar.update(counts.size)
    return sums


def _counts(seed: int, m: int, n: int):
    """(first resample, float64 counts (k, m)) chunk by chunk."""
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_DRAWS // m)
    for s in range(0, n, chunk):
        idx = rng.integers(0, m, size=(min(chunk, n - s), m))
        flat = (idx + m * np.arange(len(idx))[:, None]).ravel()
        yield s, np.bincount(flat, minlength=idx.size).reshape(idx.shape).astype(np.float64)


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _checked_level(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


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
    return resample([paired_bootstrap_plan(a, b, level)], n, seed)[0]


def paired_bootstrap_plan(a, b, level: float = 0.95) -> Plan:
    """:func:`paired_bootstrap` as a :class:`Plan` (for :func:`resample`)."""
    a, b = _vectors(a, b, names="a and b")
    level = _checked_level(level)
    d = b - a

    def finish(sums: np.ndarray) -> dict:
        low, high = _interval(sums[:, 0] / d.size, level)
        return {"delta": float(d.mean()), "low": low, "high": high, "level": level, "n_items": int(d.size),
                "n_boot": len(sums)}

    return Plan(d[:, None], finish)


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
    return float(min(Fraction(1), Fraction(2 * binomial_head(total, min(only_a, only_b)), 2 ** total)))


def binomial_head(n: int, k: int) -> int:
    """``Σ_{i ≤ k} C(n, i)`` exactly, each term from the last (``C(n, i+1) = C(n, i)·(n−i)/(i+1)``, an exact
    integer division): O(k) big-integer steps where a ``math.comb`` per term costs O(k·n) (minutes over a report
    of ten-thousand-item tasks)."""
    term = total = 1
    for i in range(k):
        term = term * (n - i) // (i + 1)
        total += term
    return total


def _windows(window_losses) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(window_losses, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != 2 or w.shape[0] == 0:
        raise ValueError("window_losses must be a non-empty list of [sum nats, tokens] pairs")
    return w[:, 0], w[:, 1]


def bootstrap_ppl_ci(window_losses, n: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Perplexity with a percentile bootstrap interval, windows resampled (``exp(Σ nats / Σ tokens)``)."""
    return resample([bootstrap_ppl_ci_plan(window_losses, level)], n, seed)[0]


def bootstrap_ppl_ci_plan(window_losses, level: float = 0.95) -> Plan:
    """:func:`bootstrap_ppl_ci` as a :class:`Plan` (for :func:`resample`)."""
    nll, tokens = _windows(window_losses)
    level = _checked_level(level)

    def finish(sums: np.ndarray) -> dict:
        low, high = _interval(np.exp(sums[:, 0] / sums[:, 1]), level)
        return {"perplexity": float(np.exp(nll.sum() / tokens.sum())), "low": low, "high": high, "level": level,
                "n_windows": int(nll.size), "n_boot": len(sums)}

    return Plan(np.stack([nll, tokens], 1), finish)


def paired_bootstrap_ppl(windows_a, windows_b, n: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Perplexity of ``b`` minus that of ``a`` on the same windows (same text and tokenizer), windows
    resampled jointly."""
    return resample([paired_bootstrap_ppl_plan(windows_a, windows_b, level)], n, seed)[0]


def paired_bootstrap_ppl_plan(windows_a, windows_b, level: float = 0.95) -> Plan:
    """:func:`paired_bootstrap_ppl` as a :class:`Plan` (for :func:`resample`)."""
    nll_a, tok_a = _windows(windows_a)
    nll_b, tok_b = _windows(windows_b)
    if tok_a.shape != tok_b.shape or not np.array_equal(tok_a, tok_b):
        raise ValueError("window losses do not pair: different windows (text, tokenizer or max_len differ)")
    level = _checked_level(level)

    def finish(sums: np.ndarray) -> dict:
        t, sa, sb = sums.T
        low, high = _interval(np.exp(sb / t) - np.exp(sa / t), level)
        ppl_a, ppl_b = (float(np.exp(x.sum() / tok_a.sum())) for x in (nll_a, nll_b))
        return {"perplexity_a": ppl_a, "perplexity_b": ppl_b, "delta": ppl_b - ppl_a, "low": low, "high": high,
                "level": level, "n_windows": int(nll_a.size), "n_boot": len(sums)}

    return Plan(np.stack([tok_a, nll_a, nll_b], 1), finish)


def difference_of_degradations(base_a, quant_a, base_b, quant_b, n: int = 10000, seed: int = 0,
                               level: float = 0.95) -> dict:
    """``(mean quant_b − mean base_b) − (mean quant_a − mean base_a)`` with a paired bootstrap interval.

    Four per-item arrays on the same items (e.g. a = Transformer, b = Diff, 0/1 correctness at 16 bits and
    quantized); items are resampled jointly in all four. ``delta_a``/``delta_b`` are each model's change from
    its baseline (negative = it lost accuracy); a positive ``difference`` means b degraded less than a.
    """
    return resample([difference_of_degradations_plan(base_a, quant_a, base_b, quant_b, level)], n, seed)[0]


def difference_of_degradations_plan(base_a, quant_a, base_b, quant_b, level: float = 0.95) -> Plan:
    """:func:`difference_of_degradations` as a :class:`Plan` (for :func:`resample`)."""
    base_a, quant_a, base_b, quant_b = _vectors(base_a, quant_a, base_b, quant_b,
                                                names="base_a, quant_a, base_b and quant_b")
    level = _checked_level(level)
    da, db = quant_a - base_a, quant_b - base_b
    diff = db - da

    def finish(sums: np.ndarray) -> dict:
        low, high = _interval(sums[:, 0] / diff.size, level)
        return {"delta_a": float(da.mean()), "delta_b": float(db.mean()), "difference": float(diff.mean()),
                "low": low, "high": high, "level": level, "n_items": int(diff.size), "n_boot": len(sums)}

    return Plan(diff[:, None], finish)
