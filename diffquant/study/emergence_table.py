"""Each long run's tracked outliers in blocks of training tokens, with the flattening rule (``diffquant.emergence``)."""

from __future__ import annotations

from ..emergence import BLOCK_KEYS, CURVES, FLAT_BLOCKS, FLAT_CHANGE, has_flattened, recent_changes
from ..tables import render
from .cells import fmt, yes_no
from .pair import tokens_label


def emergence_table(runs: dict[str, list[dict]]) -> str:
    """Block means of the tracked top-1 (``emergence.block_means``: Transformer vs other) per run, each run ending
    with the relative changes of its last blocks and whether every curve has flattened (``has_flattened``)."""
    rows = []
    for run, blocks in runs.items():
        rows += block_rows(run, blocks) + change_rows(run, blocks) + flattened_rows(run, blocks)
    header = ["run", "training tokens", "points", "logit top-1 T", "logit top-1 other", "T/other",
              "hidden top-1 T", "hidden top-1 other", "T/other"]
    return render(header, rows)


def block_rows(run: str, blocks: list[dict]) -> list[list]:
    return [[run, f"{tokens_label(b['tokens_from'])}–{tokens_label(b['tokens_to'])}", b["points"],
             *(fmt(b[site][key], 2 if key == "ratio" else 1) for site in CURVES for key in BLOCK_KEYS)]
            for b in blocks]


def change_rows(run: str, blocks: list[dict]) -> list[list]:
    """The relative change of every curve in each of the last blocks."""
    rows = []
    for back, changes in zip(reversed(range(FLAT_BLOCKS)), recent_changes(blocks), strict=True):
        if changes:
            rows.append([run, "last block's change" if back == 0 else f"change {back} block(s) earlier", "",
                         *(f"{changes[f'{site}/{key}']:+.1%}" if f"{site}/{key}" in changes else "—"
                           for site in CURVES for key in BLOCK_KEYS)])
    return rows


def flattened_rows(run: str, blocks: list[dict]) -> list[list]:
    rows = []
    for what, keys in (("every curve", BLOCK_KEYS), ("the ratios", ("ratio",))):
        if (flat := has_flattened(blocks, keys=keys)) is not None:
            rows.append([run, f"flattened: {what} (|change| < {FLAT_CHANGE:.0%} in the last {FLAT_BLOCKS} blocks)",
                         "", yes_no(flat), *[""] * (3 * len(CURVES) - 1)])
    return rows
