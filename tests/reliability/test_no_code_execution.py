"""A planted pickle never runs, whichever command meets it; shard paths stay inside their folder."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from diffquant import load_checkpoint
from diffquant.checkpoint import CheckpointError

from . import hostile as h
from .conftest import run_cli


class _Planted:
    """Unpickling this touches ``marker``: proof that the file was executed."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


@pytest.fixture
def planted(work, tmp_path) -> tuple[Path, Path]:
    folder = h.hf_folder(work["ckpt"], tmp_path / "hf")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "EXECUTED"
    for name in ("pytorch_model.bin", "model.pt", "weights.pkl"):
        (folder / name).write_bytes(pickle.dumps(_Planted(marker)))
    return folder, marker


@pytest.mark.parametrize("command", [["info"], ["profile"], ["convert", "--from", "hf", "OUT"],
                                     ["sweep", "--target", "attn_logits", "--tasks", "test", "--out", "OUT"]])
def test_planted_pickle_is_refused_and_never_runs(planted, tmp_path, capsys, command):
    folder, marker = planted
    name, *rest = command
    argv = [name, folder, *[str(tmp_path / "out") if a == "OUT" else a for a in rest]]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "pickle" in err and err.count("\n") == 1
    assert not marker.exists()


def test_pickle_file_given_directly_is_refused(planted):
    folder, marker = planted
    with pytest.raises(CheckpointError, match="never reads pickle"):
        load_checkpoint(folder / "pytorch_model.bin")
    assert not marker.exists()


def test_shard_index_cannot_reach_outside_the_folder(work, tmp_path):
    folder = h.shard_outside(h.hf_folder(work["ckpt"], tmp_path / "a" / "hf"))
    assert (tmp_path / "x.safetensors").is_file()  # a valid file, two levels up
    with pytest.raises(CheckpointError, match="inside"):
        load_checkpoint(folder)
