"""Shared set-up of the reliability suite: a tiny float checkpoint with the project tokenizer's vocabulary,
a packed copy, a text file, sweep records, and helpers to run the CLI in-process and fingerprint inputs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from diffquant import ModelConfig, build_model, save_checkpoint
from diffquant.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def fingerprint(*paths: Path) -> dict[str, str]:
    """sha256 of every file under ``paths`` (what a command must leave untouched)."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*"))) if f.is_file()]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=8192, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)
    return ModelConfig(**{**base, **overrides})


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> dict[str, Path]:
    """Built once per session; tests that change something copy it first (see ``work``)."""
    root = tmp_path_factory.mktemp("assets")
    ckpt = save_checkpoint(build_model(tiny_config(), seed=0), root / "ckpt")
    text = root / "text.txt"
    text.write_text("Once upon a time there was a little fox who liked to read books.\n" * 60)
    records = root / "records.jsonl"
    shutil.copyfile(FIXTURES / "records.jsonl", records)
    return {"ckpt": ckpt, "text": text, "records": records}


@pytest.fixture
def work(assets, tmp_path) -> dict[str, Path]:
    """Private copies of the assets in ``tmp_path`` (tests may damage them)."""
    out = {}
    for name, src in assets.items():
        dst = tmp_path / src.name
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
        out[name] = dst
    return out
