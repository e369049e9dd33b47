"""Is a model's multiple-choice accuracy above chance? A permutation test on its per-item records.

Uniform guessing (1 / number of choices) is the wrong null for small models: one that always answers "yes"
scores BoolQ's majority rate (~62%), one that prefers the first choice scores the share of gold answers there.
The test asks instead whether the model's choice carries information about the answer: the gold labels are
shuffled among items with the same number of choices, which keeps both the answer key's and the model's biases,
and the p-value is the share of shuffles scoring at least the observed accuracy. With two choices this is the
one-sided Fisher exact test of the prediction × gold table, up to Monte-Carlo error.

Why not ``scipy.stats.permutation_test``: with one choice count, ``permutation_type="pairings"`` given our
generator and batch shuffles exactly as :func:`permuted_hits` (the same p, tests/test_chance.py) in about the same
time, but it cannot shuffle within groups, which a task file mixing choice counts needs (upstream ARC has 3 to
5; the bundled tasks have one each), and calls per group do not add up: a group of at most 7 items is
enumerated exactly (n! ≤ 20,000 permutations) instead of sampled, and each call draws a whole last batch,
shifting the next group's shuffles.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PREDICTION = {"acc": "predicted", "acc_norm": "predicted_norm"}


def _arrays(items: Sequence[dict], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if metric not in PREDICTION:
        raise ValueError(f"metric must be one of {', '.join(PREDICTION)}, not {metric!r}")
    if not items:
        raise ValueError("no items to test")
    gold = np.array([it["gold"] for it in items], dtype=np.int16)
    pred = np.array([it[PREDICTION[metric]] for it in items], dtype=np.int16)
    choices = np.array([len(it["ll"]) for it in items])
    return gold, pred, choices


def permuted_hits(gold: np.ndarray, pred: np.ndarray, choices: np.ndarray, n_permutations: int,
                  seed: int) -> np.ndarray:
    """Correct answers under ``n_permutations`` shuffles of ``gold`` within groups of equal choice count."""
    rng = np.random.default_rng(seed)
    hits = np.zeros(n_permutations, dtype=np.int64)
    for size in np.unique(choices):
        idx = np.flatnonzero(choices == size)
        for start in range(0, n_permutations, 2048):  # bounded memory for long tasks
            stop = min(start + 2048, n_permutations)
            shuffled = rng.permuted(np.broadcast_to(gold[idx], (stop - start, len(idx))), axis=1)
            hits[start:stop] += (shuffled == pred[idx]).sum(axis=1)
    return hits


def above_chance(items: Sequence[dict], metric: str = "acc", n_permutations: int = 20_000, seed: int = 0) -> dict:
    """``{"metric", "n", "accuracy", "uniform_chance", "shuffled_chance", "p"}`` for multiple-choice records
    (``gold``, ``predicted``, ``predicted_norm``, ``ll`` per item, as :func:`~diffquant.evaluate.evaluate_task`
    writes them); ``p`` is one-sided, ``(1 + shuffles at least as good) / (1 + n_permutations)``."""
    gold, pred, choices = _arrays(items, metric)
    observed = int((gold == pred).sum())
    hits = permuted_hits(gold, pred, choices, n_permutations, seed)
    return {"metric": metric, "n": len(gold), "accuracy": observed / len(gold),
            "uniform_chance": float(np.mean(1.0 / choices)), "shuffled_chance": float(hits.mean() / len(gold)),
            "p": float((1 + int((hits >= observed).sum())) / (1 + n_permutations))}
