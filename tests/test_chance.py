"""The above-chance permutation test against Fisher's exact test and the permutation mean by hand."""

import numpy as np
import pytest
from scipy.stats import fisher_exact

from diffquant.chance import above_chance


def _items(gold, pred, choices) -> list[dict]:
    return [{"gold": int(g), "predicted": int(p), "predicted_norm": int(g), "ll": [0.0] * int(k)}
            for g, p, k in zip(gold, pred, choices, strict=True)]


def _informative(rng, n: int, k: int, share: float) -> tuple[np.ndarray, np.ndarray]:
    """Gold labels and predictions that copy the gold label with probability ``share``, else guess."""
    gold = rng.integers(0, k, n)
    pred = np.where(rng.random(n) < share, gold, rng.integers(0, k, n))
    return gold, pred


@pytest.mark.parametrize("share", [0.0, 0.08, 0.2])
def test_two_choices_match_the_one_sided_fisher_exact_test(share):
    rng = np.random.default_rng(int(share * 100))
    gold, pred = _informative(rng, 300, 2, share)
    table = [[np.sum((pred == a) & (gold == b)) for b in (0, 1)] for a in (0, 1)]
    expected = fisher_exact(table, alternative="greater").pvalue
    got = above_chance(_items(gold, pred, [2] * 300), n_permutations=40_000, seed=1)["p"]
    assert got == pytest.approx(expected, abs=0.012)  # Monte-Carlo error ≤ 0.0025 (one sd)


def test_a_constant_answer_on_an_unbalanced_key_is_not_above_chance():
    rng = np.random.default_rng(3)
    gold = (rng.random(400) < 0.3).astype(int)  # 70% of answers are choice 0, like BoolQ's "yes"
    result = above_chance(_items(gold, np.zeros(400), [2] * 400), n_permutations=2_000)
    assert result["accuracy"] == pytest.approx(np.mean(gold == 0)) and result["accuracy"] > result["uniform_chance"]
    assert result["p"] == 1.0  # every shuffle scores the same


def test_mixed_choice_counts_shuffle_within_groups():
    rng = np.random.default_rng(5)
    choices = rng.choice([3, 4, 5], 600)
    gold = rng.integers(0, choices)
    pred = np.where(rng.random(600) < 0.3, gold, rng.integers(0, choices))
    result = above_chance(_items(gold, pred, choices), n_permutations=5_000, seed=2)
    # the mean of a within-group shuffle, by hand: Σ_groups Σ_k #pred=k · #gold=k / group size
    by_hand = sum(np.sum(pred[choices == c] == k) * np.sum(gold[choices == c] == k) / np.sum(choices == c)
                  for c in (3, 4, 5) for k in range(c)) / 600
    assert result["shuffled_chance"] == pytest.approx(by_hand, rel=0.01)
    assert result["uniform_chance"] == pytest.approx(np.mean(1 / choices))
    assert result["p"] == pytest.approx(1 / 5_001)  # far above chance: no shuffle reaches it


def test_acc_norm_reads_the_length_normalised_prediction():
    rng = np.random.default_rng(7)
    gold, pred = _informative(rng, 200, 4, 0.0)
    result = above_chance(_items(gold, pred, [4] * 200), metric="acc_norm", n_permutations=1_000)
    assert result["accuracy"] == 1.0 and result["p"] == pytest.approx(1 / 1_001)


@pytest.mark.parametrize("items, metric, message", [([], "acc", "no items"),
                                                     ([{"gold": 0, "predicted": 0, "ll": [0, 0]}], "f1", "metric")])
def test_bad_input_is_refused(items, metric, message):
    with pytest.raises(ValueError, match=message):
        above_chance(items, metric)


@pytest.mark.parametrize("n, k, perms", [(300, 4, 5_000), (61, 2, 4_096), (1000, 5, 2_049)])
def test_one_choice_count_is_scipy_permutation_test_on_the_same_shuffles(n, k, perms):
    """scipy's "pairings" permutation test, given our generator and batch, shuffles exactly as we do: the same
    p (chance.py says why the test stays ours)."""
    from scipy.stats import permutation_test

    rng = np.random.default_rng(n)
    gold, pred = _informative(rng, n, k, 0.1)
    ours = above_chance(_items(gold, pred, [k] * n), n_permutations=perms, seed=9)["p"]
    theirs = permutation_test((gold,), lambda g, axis=-1: (g == pred).sum(axis), permutation_type="pairings",
                              vectorized=True, n_resamples=perms, batch=2048, alternative="greater",
                              rng=np.random.default_rng(9)).pvalue
    assert ours == theirs
