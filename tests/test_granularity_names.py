"""One name per activation granularity out: "sequence". Its name before the rename, "tensor", stays accepted as an
alias (DESIGN.md's contract): in files written before it, as a flag and as an argument, always read as "sequence"."""

import json
from pathlib import Path

import pytest
import torch

from diffquant import build_model
from diffquant.checkpoint import load_quantized, save_quantized
from diffquant.cli import build_parser
from diffquant.commands.info import quantization_summary
from diffquant.kinds import ATTN_LOGITS, SEQUENCE, upgrade_legacy_granularities
from diffquant.quant import ActQuant, QuantConfig, quantize_model
from diffquant.quant.act import act_granularity, quantize_activation
from diffquant.quant.numerics import PerTensor, as_granularity
from diffquant.records import read_records
from diffquant.sweep import make_scheme
from tests.conftest import tiny_config
from tests.helpers import randomize_

OLD_RECORDS = Path(__file__).parent / "fixtures" / "records.jsonl"  # written when "sequence" was "tensor"


def test_records_written_before_the_rename_read_as_sequence():
    assert '"granularity": "tensor"' in OLD_RECORDS.read_text()
    before = OLD_RECORDS.read_bytes()
    records = read_records(OLD_RECORDS)
    logits = [r for r in records if r["target"] == "attn_logits"]
    assert logits and {r["granularity"] for r in logits} == {SEQUENCE}
    assert {r["quant"]["logits"]["granularity"] for r in logits} == {SEQUENCE}
    assert OLD_RECORDS.read_bytes() == before  # read, never rewritten


def test_the_legacy_reader_renames_granularities_only_and_copies():
    old = {"granularity": "tensor", "target": "tensor", "quant": {"logits": {"bits": 4, "granularity": "tensor"},
                                                                  "hidden": {"granularity": "token"}},
           "metrics": {"items": [{"granularity": "tensor"}]}}
    new = upgrade_legacy_granularities(old)
    assert new == {**old, "granularity": SEQUENCE, "quant": {"logits": {"bits": 4, "granularity": SEQUENCE},
                                                              "hidden": {"granularity": "token"}}}
    assert old["granularity"] == "tensor" and old["quant"]["logits"]["granularity"] == "tensor"


def _save_as_before_the_rename(model, path: Path, monkeypatch) -> None:
    """save_quantized as diffquant wrote it when "sequence" was called "tensor" (scheme digest included)."""
    to_dict = ActQuant.to_dict

    def old_to_dict(self):
        data = to_dict(self)
        return {**data, "granularity": "tensor"} if data["granularity"] == SEQUENCE else data

    with monkeypatch.context() as m:
        m.setattr(ActQuant, "to_dict", old_to_dict)
        save_quantized(model, path)


def test_a_packed_checkpoint_written_before_the_rename_loads(tmp_path, monkeypatch):
    config = QuantConfig(logits=ActQuant(4), activations=ActQuant(8, SEQUENCE))
    q = quantize_model(randomize_(build_model(tiny_config("diff"))), config).eval()
    _save_as_before_the_rename(q, tmp_path / "q", monkeypatch)
    written = (tmp_path / "q" / "quant.json").read_text()
    assert '"granularity": "tensor"' in written and '"granularity": "sequence"' not in written
    loaded = load_quantized(tmp_path / "q")  # the scheme digest of the file as written still holds
    assert loaded.quant_config == config
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids), q(ids))
    summary = quantization_summary(tmp_path / "q")
    assert summary["logits"]["granularity"] == summary["activations"]["granularity"] == SEQUENCE


def test_a_quant_config_file_written_before_the_rename_loads(tmp_path):
    text = json.dumps({"logits": {"bits": 4, "granularity": "tensor"}})
    (tmp_path / "quant.json").write_text(text)
    assert QuantConfig.from_json_file(tmp_path / "quant.json") == QuantConfig(logits=ActQuant(4, SEQUENCE))
    assert QuantConfig.from_json(tmp_path / "quant.json") == QuantConfig(logits=ActQuant(4, SEQUENCE))
    assert QuantConfig.from_json_text(text) == QuantConfig(logits=ActQuant(4, SEQUENCE))


def test_the_old_name_as_an_argument_is_read_as_sequence():
    assert ActQuant(4, "tensor") == ActQuant(4, SEQUENCE) and ActQuant(4, "tensor").granularity == SEQUENCE
    assert QuantConfig.from_dict({"logits": {"granularity": "tensor"}}).logits.granularity == SEQUENCE
    assert act_granularity("tensor", 4) == act_granularity(SEQUENCE, 4)
    assert make_scheme("attn_logits", "tensor") == make_scheme("attn_logits", SEQUENCE)
    with pytest.raises(ValueError, match="unknown activation granularity 'tensr'"):
        ActQuant(4, "tensr")


def test_the_old_name_quantizes_exactly_as_sequence():
    x = torch.randn(3, 4, 2, 7, 7) * torch.rand(3, 1, 1, 1, 1) * 50  # a scale per sequence that differs
    old, new = (quantize_activation(x, ActQuant(4, name), kind=ATTN_LOGITS) for name in ("tensor", SEQUENCE))
    assert torch.equal(old, new) and not torch.equal(new, x)


def test_tensor_stays_the_whole_tensor_for_tensor_level_quantizers():
    assert as_granularity("tensor") == PerTensor()


@pytest.mark.parametrize(("argv", "dest"), [
    (["sweep", "a", "b", "--out", "r.jsonl", "--tasks", "tinystories", "--target", "attn_logits",
      "--granularity", "tensor"], "granularity"),
    (["quantize", "a", "--out", "q", "--logit-bits", "4", "--logit-granularity", "tensor"], "logit_granularity"),
    (["quantize", "a", "--out", "q", "--act-bits", "8", "--act-granularity", "tensor"], "act_granularity"),
])
def test_the_old_name_as_a_flag_is_read_as_sequence(argv, dest):
    assert getattr(build_parser().parse_args(argv), dest) == SEQUENCE
