"""Reproduce the paper's Table 5 protocol on the shipped pair (and stories260K): top-k and median of |x|.

    python experiments/table5.py [--tokens 409600] [--out experiments/results]

Pools 0.4M held-out tokens (the test split: Dracula and Pride and Prejudice), global protocol, and writes
table5.json (records), table5.md (tables), table5.png / table5-hist.png (per-layer and histogram plots),
plus the per-sequence (massive-activations) protocol for comparison and the over-training curves.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from pathlib import Path

from diffquant.cli import main as cli
from diffquant.errors import UserError
from diffquant.pairs import pair_checkpoints

REPO = Path(__file__).resolve().parent.parent  # paths below are relative to it, so records read the same anywhere
PAIR = "small-books"  # calib/models/pairs.json: parked in history, restore_states.sh brings it back


def snapshots(arch: str) -> list[str]:
    run = Path("experiments/checkpoints") / f"{arch}-small"
    return [str(p) for p in sorted((run / "snapshots").glob("step*"))] + [str(run / "final")]


def run(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli(argv)
    if code:
        raise SystemExit(f"diffquant {' '.join(argv)} failed with exit code {code}")
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=409_600)
    parser.add_argument("--out", default="experiments/results")
    args = parser.parse_args()
    os.chdir(REPO)
    out = Path(args.out)
    try:
        pair = pair_checkpoints(PAIR, relative_to=REPO)
    except UserError as exc:
        raise SystemExit(f"table5.py: {exc}") from None
    sections = {
        "global protocol (the paper's)": ["profile", *pair, "--tokens", str(args.tokens),
                                          "--json", str(out / "table5.json"), "--plot", str(out / "table5.png")],
        "per-sequence protocol (massive-activations)": [
            "profile", *pair, "--tokens", str(args.tokens // 4), "--protocol", "per_sequence",
            "--json", str(out / "table5-per-sequence.json")],
        "over training (snapshots at 10%, 30%, 100% of the budget)": [
            "profile", *snapshots("transformer"), *snapshots("diff"), "--tokens", str(args.tokens // 4),
            "--json", str(out / "table5-over-training.json"), "--training-plot", str(out / "table5-training.png")],
        "stories260K (real pretrained Llama, TinyStories data)": [
            "profile", "calib/models/stories260K.gguf", "--data", "tinystories-cased", "--seq-len", "512",
            "--tokens", str(min(args.tokens, 100_000)), "--json", str(out / "table5-stories260k.json")],
    }
    text = []
    for title, argv in sections.items():
        text.append(f"## {title}\n\n`diffquant {' '.join(argv)}`\n\n{run(argv)}")
        print(text[-1], flush=True)
    (out / "table5.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
