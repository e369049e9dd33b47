"""`diffquant profile` windows: the training context by default where known, and the tokens actually profiled."""
import json

import pytest
import torch

import diffquant as dq
from diffquant.checkpoint import training_context
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.cli import main

from .conftest import tiny_config


def test_training_context_is_known_for_stories260k_and_for_runs(tmp_path):
    assert training_context(stories260k_path()) == 512  # the file declares 2048
    run = tmp_path / "run"
    (run / "snapshots" / "step000010").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "train_log.json").write_text(json.dumps({"train_config": {"seq_len": 16}}))
    assert training_context(run / "final") == training_context(run / "snapshots" / "step000010") == 16
    assert training_context(tmp_path / "elsewhere") is None
    (tmp_path / "other.gguf").write_bytes(b"\0" * 64)
    assert training_context(tmp_path / "other.gguf") is None
    (run / "train_log.json").write_text("{not json")
    assert training_context(run / "final") is None


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A tiny model (max_seq_len 32) saved as run/final of a run trained at 16 tokens."""
    torch.manual_seed(0)
    run = tmp_path_factory.mktemp("windows") / "run"
    dq.save_checkpoint(dq.build_model(tiny_config("diff", vocab_size=8192, max_seq_len=32)), run / "final")
    (run / "train_log.json").write_text(json.dumps({"train_config": {"seq_len": 16}}))
    return run


@pytest.mark.parametrize("extra, seq_len, source, profiled", [
    ([], 16, "training context", 96), (["--seq-len", "32"], 32, "--seq-len", 96)])
def test_profile_defaults_to_the_training_context_and_says_what_it_used(run_folder, tmp_path, capsys, extra,
                                                                       seq_len, source, profiled):
    out = tmp_path / "p.json"
    assert main(["profile", str(run_folder / "final"), "--data", "test", "--tokens", "100", "--json", str(out),
                 *extra]) == 0
    (rec,) = json.loads(out.read_text())
    assert (rec["seq_len"], rec["seq_len_source"], rec["tokens"], rec["tokens_requested"]) == (
        seq_len, source, profiled, 100)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == (f"run: {profiled} tokens profiled of 100 requested (whole windows only), in "
                    f"{profiled // seq_len} windows of {seq_len} ({source})")


def test_the_library_function_takes_explicit_arguments_and_gives_the_commands_record(run_folder, tmp_path):
    from diffquant.errors import UserError
    from diffquant.profile_checkpoint import profile_checkpoint

    out = tmp_path / "p.json"
    assert main(["profile", str(run_folder / "final"), "--data", "test", "--tokens", "64", "--sites",
                 "attn_logits,hidden", "--topk", "5", "--device", "cpu", "--out", str(out)]) == 0
    (by_cli,) = json.loads(out.read_text())
    record = profile_checkpoint(str(run_folder / "final"), data="test", tokens=64, sites=("attn_logits", "hidden"),
                                topk=5)
    assert set(record["sites"]) == {"attn_logits", "hidden"} and len(record["sites"]["hidden"]["top"]) == 5
    assert json.loads(json.dumps(record["sites"])) == by_cli["sites"]
    assert {k: record[k] for k in ("seq_len", "seq_len_source", "tokens", "tokens_requested", "data")} == {
        k: by_cli[k] for k in ("seq_len", "seq_len_source", "tokens", "tokens_requested", "data")}
    with pytest.raises(UserError, match="exceeds"):
        profile_checkpoint(str(run_folder / "final"), tokens=64, seq_len=33)
