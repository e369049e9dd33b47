"""One name per activation granularity: "sequence" in, "sequence" out; "tensor" (its name before the rename) is read
only from files written before it, and refused with its new name as a flag or an argument."""

import json
from pathlib import Path

import pytest
import torch

from diffquant import build_model
from diffquant.checkpoint import load_quantized, save_quantized
from diffquant.cli import main
from diffquant.commands.info import quantization_summary
from diffquant.kinds import SEQUENCE, upgrade_legacy_granularities
from diffquant.quant import ActQuant, QuantConfig, quantize_model
from diffquant.quant.act import act_granularity
from diffquant.quant.numerics import PerTensor, as_granularity
from diffquant.records import read_records
from diffquant.sweep import make_scheme
from tests.conftest import tiny_config
from tests.helpers import randomize_

OLD_RECORDS = Path(__file__).parent / "fixtures" / "records.jsonl"  # written when "sequence" was "tensor"
RENAMED = "'tensor' was renamed 'sequence'"


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
    with pytest.raises(ValueError, match=RENAMED):  # text is an argument, not a file from before
        QuantConfig.from_json_text(text)


@pytest.mark.parametrize("make", [
    lambda: ActQuant(4, "tensor"),
    lambda: QuantConfig.from_dict({"logits": {"granularity": "tensor"}}),
    lambda: act_granularity("tensor", 4),
    lambda: make_scheme("attn_logits", "tensor"),
])
def test_the_old_name_as_an_argument_is_refused_with_its_new_one(make):
    with pytest.raises(ValueError, match=RENAMED) as info:
        make()
    assert "\n" not in str(info.value)


def test_tensor_stays_the_whole_tensor_for_tensor_level_quantizers():
    assert as_granularity("tensor") == PerTensor()


@pytest.mark.parametrize("argv", [
    ["sweep", "a", "b", "--out", "r.jsonl", "--tasks", "tinystories", "--target", "attn_logits",
     "--granularity", "tensor"],
    ["quantize", "a", "--out", "q", "--logit-bits", "4", "--logit-granularity", "tensor"],
    ["quantize", "a", "--out", "q", "--act-bits", "8", "--act-granularity", "tensor"],
])
def test_the_old_name_as_a_flag_is_a_one_line_error(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert RENAMED in captured.err and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert not list(tmp_path.iterdir())  # refused before anything was read or written
