"""`diffquant quantize`: a packed checkpoint from a saved one, sizes against fp16, one-line errors (exit 2)."""

import json
import subprocess
import sys

import pytest
import torch

from diffquant import build_model, save_checkpoint
from diffquant.checkpoint import load_quantized
from diffquant.cli import main
from diffquant.quant import QuantLinear, QuantProbe
from tests.conftest import tiny_config
from tests.helpers import randomize_


@pytest.fixture
def ckpt(tmp_path):
    model = randomize_(build_model(tiny_config("diff", vocab_size=8192, max_seq_len=32)))  # the project vocab
    return save_checkpoint(model, tmp_path / "float")


def run_cli(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_gptq_with_logits_writes_a_loadable_packed_checkpoint(ckpt, tmp_path, capsys):
    out = tmp_path / "q"
    code, stdout, _ = run_cli(["quantize", str(ckpt), "--weights", "gptq", "--bits", "4", "--group-size", "16",
                               "--logit-bits", "4", "--calib-tokens", "256", "--dtype", "float32",
                               "--out", str(out)], capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["calibration"]["windows"] == 8 and summary["calibration"]["seq_len"] == 32
    assert summary["model_safetensors_bytes"] == (out / "model.safetensors").stat().st_size
    model = load_quantized(out)
    assert isinstance(model.layers[0].attn.q_proj, QuantLinear)
    assert isinstance(model.layers[1].attn.logits, QuantProbe) and model.layers[1].attn.logits.act.bits == 4
    assert torch.isfinite(model(torch.randint(0, 8192, (1, 9)))).all()


def test_a_group_size_that_does_not_divide_a_width_ends_in_a_shorter_group(ckpt, tmp_path, capsys):
    """Widths 32 and 64, groups of 24: 24 + 8 and 24 + 24 + 16 columns, stored and loaded back exactly."""
    from diffquant import load_checkpoint
    from diffquant.quant import QuantConfig, WeightQuant, quantize

    code, _, err = run_cli(["quantize", str(ckpt), "--weights", "rtn", "--bits", "4", "--group-size", "24",
                            "--dtype", "float32", "--out", str(tmp_path / "q")], capsys)
    assert code == 0, err
    loaded = load_quantized(tmp_path / "q")
    expected = quantize(load_checkpoint(ckpt), QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=24)))
    down = loaded.layers[0].mlp.down_proj
    assert down.group_size == 24 and down.scale.shape == (32, 3)
    ids = torch.randint(0, 8192, (2, 20))
    with torch.no_grad():
        assert torch.equal(loaded(ids), expected(ids))


def test_rtn_int4_with_embeddings_is_a_fraction_of_fp16(ckpt, tmp_path, capsys):
    code, stdout, _ = run_cli(["quantize", str(ckpt), "--weights", "rtn", "--bits", "4", "--group-size", "32",
                               "--embeddings", "--out", str(tmp_path / "q")], capsys)
    assert code == 0 and json.loads(stdout)["ratio_vs_fp16"] < 0.35


@pytest.mark.parametrize("argv, words", [
    (["--weights", "rtn", "--bits", "17"], "2..8"),
    (["--weights", "rtn", "--bits", "4", "--group-size", "0"], "--group-size: must be"),
    (["--act-bits", "1"], "--act-bits: bits must be an integer in 2..16"),
    (["--logit-bits", "17"], "--logit-bits: bits must be an integer in 2..16"),
    ([], "nothing to quantize"),
    (["--bits", "4"], "need --weights"),
])
def test_bad_settings_exit_2_with_one_line(ckpt, tmp_path, capsys, argv, words):
    code, _, err = run_cli(["quantize", str(ckpt), "--out", str(tmp_path / "q"), *argv], capsys)
    assert code == 2 and words in err and err.count("\n") == 1
    assert not (tmp_path / "q").exists()


def test_never_overwrites_the_source_or_a_full_folder(ckpt, tmp_path, capsys):
    rtn = ["--weights", "rtn", "--bits", "8"]
    for out in (ckpt, ckpt / "inside"):
        code, _, err = run_cli(["quantize", str(ckpt), "--out", str(out), "--overwrite", *rtn], capsys)
        assert code == 2 and "the input checkpoint" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    code, _, err = run_cli(["quantize", str(ckpt), "--out", str(tmp_path / "full"), *rtn], capsys)
    assert code == 2 and "--overwrite" in err and (tmp_path / "full" / "keep").exists()


def test_installed_command_exit_codes(ckpt, tmp_path):
    bad = subprocess.run([sys.executable, "-m", "diffquant.cli", "quantize", str(tmp_path / "missing"),
                          "--weights", "rtn", "--bits", "4", "--out", str(tmp_path / "q")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "does not exist" in bad.stderr
