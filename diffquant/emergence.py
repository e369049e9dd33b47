"""Emergence curves from train logs (``history["outliers"]``, written by :mod:`diffquant.tracking`): the maximum
over layers of each tracked point, block means of two arms and their ratio, and whether the curves have
flattened. Pure functions of the logs (no model code), so plots and tables can use them.

A run "has flattened" when the block mean of every curve moved by less than ``FLAT_CHANGE`` (relative) in each of
the last ``FLAT_BLOCKS`` block-to-block steps: the issue's stopping rule for a long run ("until the gate holds and
the emergence curves have flattened") made a number. One quiet block is not enough: seed 0's hidden maxima held
still over 109M-117M tokens (+0.1%) and then grew 11.6% over the next block.
"""

from __future__ import annotations

from .kinds import ATTN_LOGITS, HIDDEN

CURVES = (ATTN_LOGITS, HIDDEN)
FLAT_CHANGE = 0.05  # relative change of a block mean, one block against the one before
FLAT_BLOCKS = 2  # consecutive block-to-block changes that must all stay under FLAT_CHANGE
BLOCK_KEYS = ("arm", "other", "ratio")  # per site: each arm's block mean, and their ratio


def max_over_layers(point: list[dict], site: str, key: str = "top1") -> float | None:
    values = [layer[site][key] for layer in point if site in layer and layer[site][key] is not None]
    return max(values) if values else None


def tracked_curve(log: dict) -> list[tuple[int, float | None, float | None]]:
    """(tokens, attention-logit top-1, hidden-state top-1) per tracked point, maxima over layers."""
    return [(p["tokens"], max_over_layers(p["layers"], ATTN_LOGITS), max_over_layers(p["layers"], HIDDEN))
            for p in log["history"].get("outliers", [])]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def block_means(log: dict, other: dict, block_tokens: int) -> list[dict]:
    """Means over consecutive blocks of ``block_tokens`` training tokens of both arms' tracked top-1 (points
    tracked at the same token count in both logs only), with the ratio ``log`` / ``other`` of the means.
    Only full blocks are kept: a partial last block would compare unequal spans."""
    theirs = {t: (lg, hd) for t, lg, hd in tracked_curve(other)}
    shared = [(t, (lg, hd), theirs[t]) for t, lg, hd in tracked_curve(log) if t in theirs]
    if not shared:
        return []
    gaps = [b[0] - a[0] for a, b in zip(shared, shared[1:], strict=False)]
    reach = shared[-1][0] + (min(gaps) if gaps else 0)  # the last point covers tokens up to the next one
    last_full = reach // block_tokens  # blocks [k·B, (k+1)·B) with k < last_full are complete
    blocks = []
    for k in range(last_full):
        inside = [s for s in shared if k * block_tokens <= s[0] < (k + 1) * block_tokens]
        if not inside:
            continue
        row = {"tokens_from": k * block_tokens, "tokens_to": (k + 1) * block_tokens, "points": len(inside)}
        for i, site in enumerate(CURVES):
            mine = _mean([s[1][i] for s in inside if s[1][i] is not None])
            theirs_mean = _mean([s[2][i] for s in inside if s[2][i] is not None])
            row[site] = {"arm": mine, "other": theirs_mean,
                         "ratio": mine / theirs_mean if mine is not None and theirs_mean else None}
        blocks.append(row)
    return blocks


def last_changes(blocks: list[dict]) -> dict[str, float] | None:
    """Relative change of each block mean (``{site}/{arm|other|ratio}``) from the second-to-last block to the
    last; None with fewer than two blocks."""
    if len(blocks) < 2:
        return None
    before, last = blocks[-2], blocks[-1]
    changes = {}
    for site in CURVES:
        for key in BLOCK_KEYS:
            a, b = before[site][key], last[site][key]
            if a and b is not None:
                changes[f"{site}/{key}"] = b / a - 1
    return changes


def recent_changes(blocks: list[dict], steps: int = FLAT_BLOCKS) -> list[dict[str, float] | None]:
    """``last_changes`` of each of the last ``steps`` block-to-block steps, oldest first (None where too few)."""
    return [last_changes(blocks[:len(blocks) - back]) for back in reversed(range(steps))]


def has_flattened(blocks: list[dict], limit: float = FLAT_CHANGE, keys: tuple[str, ...] = BLOCK_KEYS,
                  steps: int = FLAT_BLOCKS) -> bool | None:
    """True when every curve's block mean moved by less than ``limit`` in each of the last ``steps`` block-to-block
    changes; None with fewer than ``steps + 1`` blocks. ``keys`` picks the curves: ``("ratio",)`` asks only whether
    the two arms' ratios have levelled off."""
    changes = recent_changes(blocks, steps)
    if not all(changes):
        return None
    return all(abs(c) < limit for step in changes for name, c in step.items() if name.split("/")[1] in keys)
