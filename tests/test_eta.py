"""The expected time of long work: one INFO line on the diffquant.eta logger (shown by the CLI without -v) after the
first batch, and the command-line defaults a user can wait for."""

import json
import logging

import pytest
import torch

import diffquant as dq
from diffquant import eta
from diffquant.cli import build_parser, main
from diffquant.commands.profile import DEFAULT_TOKENS
from diffquant.commands.sweep import DEFAULT_LIMIT
from diffquant.data import documents
from diffquant.records import read_records

from .conftest import tiny_config
from .helpers import randomize_


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("eta")
    torch.manual_seed(0)
    model = randomize_(dq.build_model(tiny_config("transformer", vocab_size=8192, max_seq_len=32)))
    text = root / "text.txt"
    text.write_text(documents("tinyshakespeare")[0].text[:2000])
    return str(dq.save_checkpoint(model, root / "tiny")), str(text)


def test_durations_read_as_people_say_them():
    assert [eta.duration(s) for s in (4.4, 59.6, 200, 3599, 7500)] == ["4 s", "1 min 00 s", "3 min 20 s",
                                                                        "59 min 59 s", "2 h 05 min"]


def test_the_first_batch_sets_the_estimate_and_only_long_work_is_announced(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="diffquant.eta")
    synced = []
    estimate = eta.FirstBatchEstimate("work", 1000, sync=lambda: synced.append(1))
    estimate.start -= 2.0  # as if the first batch had taken two seconds (a clock, not a timing assert)
    estimate.batch_done(100)
    estimate.batch_done(100)  # later batches change nothing
    assert synced == [1] and estimate.seconds >= 20.0  # 10 × the first batch
    assert not caplog.records  # under MIN_SECONDS: no line
    monkeypatch.setattr(eta, "MIN_SECONDS", 0.0)
    eta.FirstBatchEstimate("work", 1000).batch_done(100)
    eta.FirstBatchEstimate("off", 1000, enabled=False).batch_done(100)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "work: about" in record.message
    assert "expected for 1,000 tokens (the first 100 took" in record.message


def _eta_lines(caplog) -> list[str]:
    return [r.message for r in caplog.records if r.name == "diffquant.eta"]


def test_profile_says_its_expected_time_on_the_cli_and_takes_the_default_tokens(assets, tmp_path, monkeypatch,
                                                                                 caplog):
    ckpt, text = assets
    monkeypatch.setattr(eta, "MIN_SECONDS", 0.0)
    logging.getLogger("diffquant.eta").setLevel(logging.NOTSET)  # what the CLI must change
    assert main(["profile", ckpt, "--data", text, "--out", str(tmp_path / "p.json")]) == 0
    record = json.loads((tmp_path / "p.json").read_text())[0]
    assert record["tokens_requested"] == DEFAULT_TOKENS == 65_536
    (line,) = [m for m in _eta_lines(caplog) if m.startswith("profile tiny")]
    assert f"expected for {record['tokens']:,} tokens" in line


def test_sweep_says_each_cells_expected_time_and_takes_the_default_limit(assets, tmp_path, monkeypatch, caplog):
    ckpt, text = assets
    monkeypatch.setattr(eta, "MIN_SECONDS", 0.0)
    logging.getLogger("diffquant.eta").setLevel(logging.NOTSET)
    out = tmp_path / "r.jsonl"
    assert main(["sweep", ckpt, "--target", "attn_logits", "--bits", "16", "4", "--tasks", text, "--no-table",
                 "--out", str(out)]) == 0
    records = read_records(out)
    assert [r["limit"] for r in records] == [DEFAULT_LIMIT, DEFAULT_LIMIT] == [128, 128]
    assert len([m for m in _eta_lines(caplog) if m.startswith("perplexity: about")]) == 2  # one per cell
    assert build_parser().parse_args(["sweep", ckpt, "--target", "none", "--tasks", "copa", "--limit", "all",
                                      "--out", "x"]).limit is None
