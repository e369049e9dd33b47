"""`diffquant demo` end to end on tiny saved models (the real run uses the shipped pair; see README)."""

import json

import pytest

from diffquant import build_model, save_checkpoint
from diffquant.cli import main

from .conftest import tiny_config


@pytest.mark.slow
def test_demo_writes_tables_records_and_plots(tmp_path, capsys):
    pair = []
    for arch in ("transformer", "diff"):
        path = tmp_path / f"{arch}-tiny" / "final"
        save_checkpoint(build_model(tiny_config(arch, vocab_size=8192, max_seq_len=64), seed=1), path)
        pair.append(str(path))
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--pair", *pair, "--no-stories", "--profile-tokens", "512",
                 "--ppl-windows", "2", "--limit", "4", "--tasks", "wikitext2", "--calib-tokens", "128"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "attention logits" in printed and "Transformer/Diff" in printed and "16 bit" in printed
    outliers = json.loads((out / "outliers.json").read_text())
    assert outliers["diff"]["sites"]["attn_logits"]["count"] > 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    targets = {r["target"] for r in records}
    assert targets == {None, "attn_logits", "weights-rtn", "weights-gptq", "linear_inputs"}
    for name in ("outliers.md", "outliers-layers.png", "outliers-hist.png", "degradation.md", "figure8.png",
                 "summary.json"):
        assert (out / name).stat().st_size > 0


def test_demo_without_the_shipped_models_is_a_one_line_error(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "d"), "--pair", str(tmp_path / "a"), str(tmp_path / "b")])
    assert code == 2
    err = capsys.readouterr().err
    assert "not found" in err and err.count("\n") == 1
