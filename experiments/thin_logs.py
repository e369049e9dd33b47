"""Thin the progress-bar redraws out of training and evaluation logs written before bars were rate-limited.

    python experiments/thin_logs.py LOG [LOG ...] [--every 30]

Logs written off a terminal before `diffquant.progress` limited redraws hold one tqdm redraw per second or so,
joined by carriage returns (3 MB for a 30K-step run). This keeps what a reader needs: every line that is not a
progress bar, the first and last redraw of each bar, and one redraw per ``--every`` seconds of the bar's own
elapsed time in between, one per line (as bars are written now). Rewrites each file atomically; a thinned log is
left unchanged by a second run.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from diffquant.io import atomic_write_text

# "train diff:  18%|####   | 5532/30720 [03:38<9:50:55, ..." -> the elapsed time, "03:38"
BAR = re.compile(r"^(?P<desc>[^|\n]*): *\d+%\|[^|]*\| *\d+/\d+ \[(?P<elapsed>\d+(?::\d\d)+)")


def seconds(clock: str) -> int:
    """'1:02:03' -> 3723, '02:03' -> 123."""
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total


def thin(text: str, every: float = 30.0) -> str:
    """The log with progress-bar redraws at most one per ``every`` seconds of elapsed time (see the module doc)."""
    out: list[str] = []
    last_kept: float | None = None  # elapsed seconds of the last bar redraw kept
    pending: str | None = None  # the latest bar redraw not kept yet: written if the bar ends on it
    desc = ""  # the bar's description, to tell one bar from the next
    for line in text.split("\n"):
        segments = [s for s in line.split("\r") if s]
        for segment in segments:
            bar = BAR.match(segment)
            if bar is None:
                if pending is not None:
                    out.append(pending)
                    pending = None
                out.append(segment)
                last_kept = None
                continue
            elapsed = seconds(bar["elapsed"])
            new_bar = last_kept is None or bar["desc"] != desc or elapsed < last_kept
            if new_bar and pending is not None:  # the previous bar's last redraw
                out.append(pending)
            if new_bar or elapsed - last_kept >= every:
                out.append(segment)
                last_kept, desc, pending = elapsed, bar["desc"], None
            else:
                pending = segment
        if pending is not None:  # a bar's last redraw before a newline is its final state
            out.append(pending)
            pending = None
        if not segments:
            out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--every", type=float, default=30.0, help="seconds of a bar's elapsed time between redraws")
    args = parser.parse_args()
    for path in args.logs:
        before = path.read_bytes().decode()  # not read_text: universal newlines would turn each \r into a line
        after = thin(before, args.every)
        if after != before:
            atomic_write_text(path, after)
        print(f"{path}: {len(before.encode()) / 1e6:.2f} MB -> {len(after.encode()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
