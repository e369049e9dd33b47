"""The same flags mean the same thing everywhere: --out (old names kept), --device on every command that runs a
model (bad ones refused in one line), --tokenizer refused where no text is read, a closed pipe ends quietly."""

import json
import subprocess
import sys

import pytest

from diffquant import build_model, save_checkpoint
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.cli import build_parser, main

from .conftest import tiny_config


def one_line(capsys, needle):
    err = capsys.readouterr().err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1 and needle in err, err


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m"
    save_checkpoint(build_model(tiny_config(vocab_size=8192, max_seq_len=32)), path)
    return path


@pytest.mark.parametrize("command", ["profile", "quantize", "sweep"])
def test_device_flag_on_every_model_command(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    assert "--device" in sub._option_string_actions


@pytest.mark.parametrize("device, needle", [("cuda:7", "not available"), ("tpu", "unknown device")])
def test_a_bad_device_is_refused_in_one_line(ckpt, tmp_path, capsys, device, needle):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    for argv in (["profile", str(ckpt), "--tokens", "64"],
                 ["quantize", str(ckpt), "--weights", "rtn", "--bits", "4", "--out", str(tmp_path / "q")],
                 ["sweep", str(ckpt), "--target", "none", "--tasks", "tinystories", "--out", str(tmp_path / "r")]):
        assert main([*argv, "--device", device]) == 2
        one_line(capsys, needle)


def test_profile_and_quantize_run_on_the_cpu_device(ckpt, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", str(ckpt), "--data", "tinystories-cased", "--tokens", "64", "--seq-len", "32",
                 "--device", "cpu", "--out", str(out)]) == 0
    assert json.loads(out.read_text())[0]["tokens"] == 64
    assert main(["quantize", str(ckpt), "--weights", "rtn", "--bits", "4", "--device", "cpu",
                 "--out", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "quant.json").is_file()


def test_out_is_the_output_flag_everywhere_with_the_old_names_kept(ckpt, tmp_path, capsys):
    assert main(["profile", str(ckpt), "--data", "tinystories-cased", "--tokens", "64", "--seq-len", "32",
                 "--json", str(tmp_path / "old.json")]) == 0
    assert (tmp_path / "old.json").is_file()
    assert main(["convert", str(ckpt), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert main(["convert", str(ckpt), str(tmp_path / "hf2"), "--to", "hf"]) == 0
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "hf2" / "config.json").is_file()
    capsys.readouterr()
    assert main(["convert", str(ckpt), "--to", "hf"]) == 2
    one_line(capsys, "--out")
    assert main(["convert", str(ckpt), "--to", "hf", "--out", str(ckpt / "inside")]) == 2  # the input stays safe
    capsys.readouterr()
    records = tmp_path / "r.jsonl"
    assert main(["sweep", str(ckpt), "--target", "none", "--tasks", "tinystories", "--limit", "1", "--no-table",
                 "--out", str(records)]) == 0
    for flag in ("--out", "--output"):
        assert main(["report", str(records), "--n-boot", "10", flag, str(tmp_path / f"t{flag}.md")]) == 0
        assert (tmp_path / f"t{flag}.md").read_text().strip()


def test_tokenizer_is_refused_where_no_text_is_read(ckpt, tmp_path, capsys):
    assert main(["quantize", str(ckpt), "--weights", "rtn", "--bits", "4", "--tokenizer", str(ckpt),
                 "--out", str(tmp_path / "q")]) == 2
    one_line(capsys, "reads no text")


def test_a_closed_pipe_ends_quietly():
    """The reader is gone before the first write (the child still imports torch): the write fails with EPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "diffquant", "info", str(stories260k_path())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait() == 141 and err == ""  # 128 + SIGPIPE, as a shell reports for a Unix tool; no message
