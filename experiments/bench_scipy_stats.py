"""The report's paired bootstrap and the above-chance permutation test against scipy.stats, side by side.

    python experiments/bench_scipy_stats.py [--items 10042] [--windows 2000] [--n-boot 10000] [--statistics 48]

Given the same generator and batch, ``scipy.stats.bootstrap(paired=True, method="percentile")`` draws exactly our
resamples and ``scipy.stats.permutation_test(permutation_type="pairings")`` exactly our shuffles, so each pair of
numbers must agree to rounding: printed with the seconds of each and their ratio. Rows: one paired accuracy
interval (HellaSwag-sized), one paired perplexity interval, ``--statistics`` accuracy intervals over the same
items as a report asks for them (ours: one pass over shared resamples), one permutation test.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.stats

from diffquant import paired
from diffquant.chance import above_chance


def timed(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def scipy_interval(data, statistic, n_boot: int, seed: int, m: int) -> tuple[float, float]:
    res = scipy.stats.bootstrap(data, statistic, paired=True, vectorized=True, method="percentile",
                                n_resamples=n_boot, batch=max(1, paired.CHUNK_DRAWS // m),
                                rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def accuracy_change(a, b, axis=-1):
    return b.mean(axis) - a.mean(axis)


def perplexity_change(tokens, nll_a, nll_b, axis=-1):
    t = tokens.sum(axis)
    return np.exp(nll_b.sum(axis) / t) - np.exp(nll_a.sum(axis) / t)


def row(label: str, ours: tuple, ours_s: float, theirs: tuple, theirs_s: float) -> None:
    gap = max(abs(x - y) for x, y in zip(ours, theirs, strict=True))
    print(f"{label:40}{ours_s:9.2f}{theirs_s:9.2f}{theirs_s / ours_s:8.1f}   {gap:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10042)
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--n-boot", type=int, default=10000)
    parser.add_argument("--statistics", type=int, default=48)
    parser.add_argument("--permutations", type=int, default=20000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    m, n = args.items, args.n_boot
    a = (rng.random(m) < 0.45).astype(float)
    quantized = [np.where(rng.random(m) < 0.9, a, 1 - a) for _ in range(args.statistics)]
    tokens = np.full(args.windows, 256.0)
    nll_a = rng.normal(1500, 80, args.windows)
    nll_b = nll_a + rng.normal(15, 5, args.windows)
    print(f"{'CPU seconds':40}{'ours':>9}{'scipy':>9}{'ratio':>8}   largest difference")

    ours, s1 = timed(lambda: paired.paired_bootstrap(a, quantized[0], n=n, seed=1))
    theirs, s2 = timed(lambda: scipy_interval((a, quantized[0]), accuracy_change, n, 1, m))
    row(f"accuracy change ({m} items)", (ours["low"], ours["high"]), s1, theirs, s2)

    windows = np.stack([nll_a, tokens], 1), np.stack([nll_b, tokens], 1)
    ours, s1 = timed(lambda: paired.paired_bootstrap_ppl(*windows, n=n, seed=1))
    theirs, s2 = timed(lambda: scipy_interval((tokens, nll_a, nll_b), perplexity_change, n, 1, args.windows))
    row(f"perplexity change ({args.windows} windows)", (ours["low"], ours["high"]), s1, theirs, s2)

    plans = [paired.paired_bootstrap_plan(a, b) for b in quantized]
    ours, s1 = timed(lambda: paired.resample(plans, n, seed=1))
    theirs, s2 = timed(lambda: [scipy_interval((a, b), accuracy_change, n, 1, m) for b in quantized])
    row(f"{args.statistics} accuracy changes, shared items", tuple(x for r in ours for x in (r["low"], r["high"])),
        s1, tuple(x for r in theirs for x in r), s2)

    gold = rng.integers(0, 4, m)
    pred = np.where(rng.random(m) < 0.3, gold, rng.integers(0, 4, m))
    items = [{"gold": int(g), "predicted": int(p), "predicted_norm": int(p), "ll": [0.0] * 4}
             for g, p in zip(gold, pred, strict=True)]
    ours, s1 = timed(lambda: above_chance(items, n_permutations=args.permutations, seed=2))
    theirs, s2 = timed(lambda: scipy.stats.permutation_test(
        (gold,), lambda g, axis=-1: (g == pred).sum(axis), permutation_type="pairings", vectorized=True,
        n_resamples=args.permutations, batch=2048, alternative="greater", rng=np.random.default_rng(2)))
    row(f"permutation test ({m} items, 4 choices)", (ours["p"],), s1, (float(theirs.pvalue),), s2)


if __name__ == "__main__":
    main()
