"""Emergence curves from train logs: maxima over layers, block means of two arms, the flattening rule."""

import numpy as np
import pytest

from diffquant.emergence import block_means, has_flattened, last_changes, max_over_layers, tracked_curve


def train_log(logits: np.ndarray, hidden: np.ndarray, every: int = 100) -> dict:
    """A train log whose point i has per-layer top-1 values logits[i, :] and hidden[i, :] at tokens i·every."""
    points = [{"tokens": i * every, "layers": [{"layer": j, "attn_logits": {"top1": float(logits[i, j])},
                                                "hidden": {"top1": float(hidden[i, j])}}
                                               for j in range(logits.shape[1])]}
              for i in range(len(logits))]
    return {"history": {"outliers": points}}


def test_tracked_curve_is_the_maximum_over_layers():
    rng = np.random.default_rng(0)
    logits, hidden = rng.uniform(1, 50, (7, 3)), rng.uniform(1, 50, (7, 3))
    curve = tracked_curve(train_log(logits, hidden))
    assert [c[0] for c in curve] == [0, 100, 200, 300, 400, 500, 600]
    assert [c[1] for c in curve] == pytest.approx(logits.max(axis=1).tolist())
    assert [c[2] for c in curve] == pytest.approx(hidden.max(axis=1).tolist())
    assert max_over_layers([{"hidden": {"top1": None}}], "hidden") is None


def test_block_means_keep_full_blocks_of_shared_points_only():
    rng = np.random.default_rng(1)
    n = 11  # points at 0..1000 tokens; blocks of 400: [0, 400), [400, 800) full, [800, 1200) has 3 of 4
    a_log, a_hid, b_log, b_hid = (rng.uniform(1, 100, (n, 2)) for _ in range(4))
    blocks = block_means(train_log(a_log, a_hid), train_log(b_log, b_hid), block_tokens=400)
    assert [(b["tokens_from"], b["tokens_to"], b["points"]) for b in blocks] == [(0, 400, 4), (400, 800, 4)]
    for b, rows in zip(blocks, (slice(0, 4), slice(4, 8)), strict=True):
        mine, theirs = a_log.max(axis=1)[rows].mean(), b_log.max(axis=1)[rows].mean()
        assert b["attn_logits"]["arm"] == pytest.approx(mine)
        assert b["attn_logits"]["other"] == pytest.approx(theirs)
        assert b["attn_logits"]["ratio"] == pytest.approx(mine / theirs)
        assert b["hidden"]["ratio"] == pytest.approx(a_hid.max(axis=1)[rows].mean() / b_hid.max(axis=1)[rows].mean())
    # the other arm tracked only every second point: blocks average the shared points
    sparse = train_log(b_log[::2], b_hid[::2], every=200)
    (first, *_) = block_means(train_log(a_log, a_hid), sparse, block_tokens=400)
    assert first["points"] == 2 and first["attn_logits"]["arm"] == pytest.approx(a_log.max(axis=1)[[0, 2]].mean())
    assert block_means(train_log(a_log, a_hid), {"history": {}}, 400) == []


def test_flattening_rule_on_a_levelled_and_a_growing_curve():
    steps = np.arange(32, dtype=float)
    level = np.stack([100 - 60 * np.exp(-steps / 2)] * 2, axis=1)  # levels off after ~8 points (4 blocks)
    growing = np.stack([5 + 4 * steps] * 2, axis=1)  # hidden maxima grow linearly
    other = np.full((32, 2), 50.0)
    flat = block_means(train_log(level, level), train_log(other, other), block_tokens=800)
    assert has_flattened(flat) is True
    rising = block_means(train_log(level, growing), train_log(other, other), block_tokens=800)
    changes = last_changes(rising)
    expected = (5 + 4 * np.arange(24, 32)).mean() / (5 + 4 * np.arange(16, 24)).mean() - 1
    assert changes["hidden/arm"] == pytest.approx(expected) and changes["hidden/ratio"] == pytest.approx(expected)
    assert abs(changes["attn_logits/arm"]) < 0.05 and has_flattened(rising) is False
    assert has_flattened(rising, keys=("ratio",)) is False  # the other arm is flat, so the ratio grows too
    both_rising = block_means(train_log(level, growing), train_log(other, growing), block_tokens=800)
    assert has_flattened(both_rising) is False and has_flattened(both_rising, keys=("ratio",)) is True
    assert has_flattened(rising[:1]) is None and last_changes([]) is None
    assert has_flattened(rising[:2]) is None  # one change: the rule wants two


def test_one_quiet_block_after_growth_is_not_flattened():
    # seed 0's hidden maxima at 101-134M tokens: level for one block, then growing again, then level once more
    hidden = np.repeat([159.1, 159.3, 177.8, 185.2], 8).astype(float)
    logits = np.full(32, 108.0)
    other = np.full((32, 2), 80.0)
    blocks = block_means(train_log(np.stack([logits] * 2, 1), np.stack([hidden] * 2, 1)), train_log(other, other),
                         block_tokens=800)
    assert [round(b["hidden"]["arm"], 1) for b in blocks] == [159.1, 159.3, 177.8, 185.2]
    assert has_flattened(blocks[:2], steps=1) is True and has_flattened(blocks[:3]) is False  # +0.1%, then +11.6%
    assert abs(last_changes(blocks)["hidden/arm"]) < 0.05 and has_flattened(blocks) is False  # +4.2% after +11.6%
    assert has_flattened(blocks, steps=1) is True
    level = np.repeat([159.1, 159.3, 160.0, 158.9], 8).astype(float)
    quiet = block_means(train_log(np.stack([logits] * 2, 1), np.stack([level] * 2, 1)), train_log(other, other),
                        block_tokens=800)
    assert has_flattened(quiet) is True


def test_emergence_table_and_files(tmp_path):
    from diffquant.study.emergence_table import emergence_table
    from diffquant.study.outputs import write_emergence

    steps = np.arange(24, dtype=float)
    growing = np.stack([10 + 2 * steps] * 2, axis=1)
    other = np.full((24, 2), 20.0)
    runs = {"run-a": block_means(train_log(growing, growing), train_log(other, other), block_tokens=800)}
    text = emergence_table(runs)
    means = [(10 + 2 * np.arange(8 * k, 8 * k + 8)).mean() for k in range(3)]
    assert f"{means[2] / means[1] - 1:+.1%}" in text and f"{means[1] / means[0] - 1:+.1%}" in text
    assert "0–800" in text and "change 1 block(s) earlier" in text
    assert "flattened: every curve" in text and "flattened: the ratios" in text and "| no " in text
    write_emergence(tmp_path, runs)
    assert (tmp_path / "emergence.md").read_text().strip() == text
    assert '"run-a"' in (tmp_path / "emergence.json").read_text()
