"""No silent wrong results (NaN/Inf are detected, recorded, marked and reported) and byte-identical outputs for
the same inputs (sha256 of every file each command writes)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from diffquant import build_model, save_checkpoint
from diffquant.evaluate import finite_metrics

from .conftest import run_cli, tiny_config


def _sha(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ non-finite

@pytest.fixture(scope="module")
def overflowing(tmp_path_factory) -> Path:
    """Finite weights whose activations overflow: every norm scales by 3e38."""
    model = build_model(tiny_config(), seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(3e38)
    return save_checkpoint(model, tmp_path_factory.mktemp("nan") / "overflow")


def test_nonfinite_losses_are_recorded_marked_and_fail_the_command(overflowing, assets, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code, _, err = run_cli(["sweep", overflowing, "--target", "attn_logits", "--bits", "16", "8", "--tasks",
                            assets["text"], "--limit", "2", "--out", out, "--no-table"], capsys)
    assert code == 1 and "NaN/Inf" in err.splitlines()[-1]
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text  # standard JSON
    for rec in map(json.loads, text.splitlines()):
        assert rec["metrics"]["perplexity"] is None and rec["nonfinite"] == {"units": 2, "of": 2}
    code, table, err = run_cli(["report", out], capsys)
    assert code == 1 and table.count("NaN/Inf") == 2
    code, table, err = run_cli(["report", out, "--format", "csv"], capsys)
    assert code == 1 and table.count(",nan,") == 2


def test_profile_table_shows_nan_and_inf_counts(overflowing, assets, capsys):
    code, table, err = run_cli(["profile", overflowing, "--data", assets["text"], "--tokens", "128", "--seq-len",
                                "64"], capsys)
    header = table.splitlines()[0]
    assert "NaN" in header and "Inf" in header
    assert code == 1 and "NaN/Inf" in err.splitlines()[-1]  # every site held only NaN/Inf


def test_accuracy_from_nan_log_likelihoods_is_null():
    items = [{"id": 0, "ll": [-1.0, float("nan")], "correct": True}, {"id": 1, "ll": [-2.0, -1.0], "correct": True}]
    metrics, bad = finite_metrics({"n": 2, "acc": 1.0, "acc_norm": 1.0, "items": items})
    assert metrics["acc"] is None and metrics["acc_norm"] is None and bad == {"units": 1, "of": 2}
    assert metrics["items"][0]["ll"] == [-1.0, None]
    json.dumps(metrics, allow_nan=False)


def test_finite_metrics_pass_through_unchanged():
    metrics = {"loss": 1.5, "perplexity": 4.48, "window_losses": [[3.0, 2]], "tokens": 2}
    assert finite_metrics(metrics) == (metrics, None)


# ------------------------------------------------------------------------------------------------ determinism

def test_quantize_twice_is_byte_identical(assets, tmp_path, capsys):
    argv = ["quantize", assets["ckpt"], "--weights", "rtn", "--bits", "4", "--group-size", "16", "--logit-bits",
            "8", "--out", tmp_path / "q"]
    shas = []
    for _ in range(3):
        assert run_cli(argv, capsys)[0] == 0
        shas.append(_sha(tmp_path / "q"))
        shutil.rmtree(tmp_path / "q")
    assert shas[0] == shas[1] == shas[2] and set(shas[0]) == {"config.json", "model.safetensors", "quant.json"}


def test_safetensors_metadata_order_never_changes_the_bytes(tmp_path):
    model = build_model(tiny_config(), seed=0)
    meta = {f"key{i}": str(i) for i in range(20)}
    a = save_checkpoint(model, tmp_path / "a", metadata=meta)
    b = save_checkpoint(model, tmp_path / "b", metadata=dict(reversed(meta.items())))
    assert _sha(a) == _sha(b)


def test_convert_to_hf_twice_is_byte_identical(assets, tmp_path, capsys):
    for name in ("a", "b"):
        assert run_cli(["convert", assets["ckpt"], tmp_path / name, "--to", "hf"], capsys)[0] == 0
    assert _sha(tmp_path / "a") == _sha(tmp_path / "b")


def test_profile_json_twice_is_byte_identical(assets, tmp_path, capsys):
    for name in ("a.json", "b.json"):
        argv = ["profile", assets["ckpt"], "--data", assets["text"], "--tokens", "256", "--seq-len", "64",
                "--json", tmp_path / name]
        assert run_cli(argv, capsys)[0] == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_sweep_records_are_identical_apart_from_timing(assets, tmp_path, capsys):
    volatile = ("created", "wall_time_s", "quantize_s")
    runs = []
    for name in ("a.jsonl", "b.jsonl"):
        argv = ["sweep", assets["ckpt"], "--target", "weights-rtn", "--bits", "16", "4", "--tasks", assets["text"],
                "--limit", "2", "--out", tmp_path / name, "--no-table"]
        assert run_cli(argv, capsys)[0] == 0
        runs.append([{k: v for k, v in json.loads(line).items() if k not in volatile and k != "out"}
                     for line in (tmp_path / name).read_text().splitlines()])
    assert runs[0] == runs[1] and len(runs[0]) == 2
