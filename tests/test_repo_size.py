"""Main's tree stays light (issue 39): no tracked file over 5 MB under experiments/ beyond a shrinking allow-list,
the tracked tree under a ceiling that only moves down, and a `git clone --depth 1` of it under 100 MB on disk.
Resumable states, branches, snapshots and the finals' weights (all but the shipped pair's) belong in history,
parked with experiments/campaign/park_states.sh, not in the tree."""

import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILE_LIMIT = 5_000_000
GOAL_BYTES = 100_000_000  # issue 39: a shallow clone of main under 100 MB on disk
CEILING_BYTES = 49_000_000  # the tree: 45.4 MB once the Table-5 profiles were gzip'ed too (51.8 MB before, 62 MB
# before the study's records were)
GIT_OVERHEAD_BYTES = 1_000_000  # a clone's .git beside its pack (index, hooks, config): 0.5 MB measured
ALLOWED_LARGE: set[str] = set()  # files over the limit still in the tree: none (checkpoints over 5 MB are parked)

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs a git checkout")


def tracked_sizes() -> dict[str, int]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True).stdout
    paths = [p for p in out.decode().split("\0") if p]
    return {p: (ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file()}


def test_no_new_large_file_under_experiments():
    large = {p: n for p, n in tracked_sizes().items() if p.startswith("experiments/") and n > FILE_LIMIT}
    offenders = sorted(f"{p} ({n / 1e6:.1f} MB)" for p, n in large.items() if p not in ALLOWED_LARGE)
    assert not offenders, f"tracked files over 5 MB (park states; commit finals, logs, sha256): {offenders}"
    gone = sorted(ALLOWED_LARGE - set(large))
    assert not gone, f"no longer large or tracked: remove from ALLOWED_LARGE: {gone}"


def test_tree_under_its_ceiling():
    sizes = tracked_sizes()
    total = sum(sizes.values())
    biggest = ", ".join(f"{p} ({n / 1e6:.1f} MB)" for p, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert total <= CEILING_BYTES, f"tree {total / 1e6:.1f} MB > {CEILING_BYTES / 1e6:.0f} MB; largest: {biggest}"


def test_a_shallow_clone_under_the_goal():
    """A depth-1 clone holds each file twice: checked out, and zlib-compressed in its pack (git's default level;
    without the deltas git may find, an upper bound: 87.1 MB estimated for 87.6 MB measured with .git's rest)."""
    sizes = tracked_sizes()
    packed = sum(len(zlib.compress((ROOT / p).read_bytes(), 6)) for p in sizes)
    clone = sum(sizes.values()) + packed + GIT_OVERHEAD_BYTES
    assert clone <= GOAL_BYTES, (f"a depth-1 clone would take about {clone / 1e6:.1f} MB on disk: park finals' "
                                 "weights or states (experiments/README.md)")
