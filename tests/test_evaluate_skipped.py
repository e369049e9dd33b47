"""evaluate_skipped.py finds the H200 run's skipped pair from its folders, as that run's pairs.json names pairs."""

import json
from pathlib import Path

import pytest

from .helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "gpu" / "evaluate_skipped.py"


def cooled(root: Path, arch: str, tokens: int) -> Path:
    folder = root / "cooled" / f"xs-s1-{arch}-100M"
    (folder / "final").mkdir(parents=True)
    (folder / "train_log.json").write_text(json.dumps({"tokens_seen": tokens}))
    return folder


def test_the_pair_entry_matches_the_runs_naming(tmp_path):
    script = load_script(SCRIPT)
    folders = {arch: cooled(tmp_path, arch, 100_007_936) for arch in ("transformer", "diff")}
    pair = script.skipped_pair(tmp_path, "xs", 1, "100M")
    assert pair["pair"] == "xs-s1-100M" and pair["tokens"] == 100_007_936 and list(pair["checkpoints"]) == [
        "transformer", "diff"]
    assert pair["checkpoints"]["diff"] == str(folders["diff"] / "final")
    assert pair["train_logs"]["transformer"] == str(folders["transformer"] / "train_log.json")


def test_refusals(tmp_path):
    script = load_script(SCRIPT)
    cooled(tmp_path, "transformer", 100)
    with pytest.raises(SystemExit, match="no checkpoint at .*xs-s1-diff-100M/final"):
        script.skipped_pair(tmp_path, "xs", 1, "100M")
    cooled(tmp_path, "diff", 101)
    with pytest.raises(SystemExit, match="different token counts"):
        script.skipped_pair(tmp_path, "xs", 1, "100M")
