"""Quantize once, evaluate the artifact: `sweep --target none` scores packed folders, compressed-tensors folders and
GGUF Q8_0 / Q4_0 files as stored, equal to plain perplexity on the loaded model; other targets on a quantized
folder, and bits other than 16, are refused in one line; `info` on a packed folder reports the full parameter
count and the scheme."""

import json
import shutil

import pytest
import torch

from diffquant import build_model, save_checkpoint
from diffquant.checkpoint import checkpoint_format, load_checkpoint, save_quantized
from diffquant.cli import main
from diffquant.compressed import save_compressed
from diffquant.data import documents
from diffquant.evaluate import perplexity_metrics
from diffquant.gguf_export import save_gguf
from diffquant.quant import QuantConfig, WeightQuant, quantize
from diffquant.records import read_records
from diffquant.tokenizer import default_tokenizer, default_tokenizer_path

from .conftest import tiny_config
from .helpers import randomize_

TASK, LIMIT = "tinystories", 2


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """One random Transformer quantized to 4 bits (groups of 32), stored four ways."""
    root = tmp_path_factory.mktemp("stored")
    torch.manual_seed(0)
    model = randomize_(build_model(tiny_config("transformer", vocab_size=8192, d_model=64, n_heads=2,
                                               max_seq_len=64)))
    save_checkpoint(model, root / "float")
    qmodel = quantize(model, QuantConfig(weights=WeightQuant("rtn", 4, 32)))
    save_quantized(qmodel, root / "packed", dtype=torch.float32)
    save_compressed(qmodel, root / "compressed", tokenizer=default_tokenizer(), dtype=torch.float32)
    paths = {"float": root / "float", "packed": root / "packed", "compressed": root / "compressed"}
    for kind in ("q8_0", "q4_0"):
        save_gguf(model, root / f"{kind}.gguf", kind, tokenizer=default_tokenizer())
        paths[kind] = root / f"{kind}.gguf"
    return paths


def plain_loss(path):
    tok = default_tokenizer()
    return perplexity_metrics(load_checkpoint(path), tok, documents("tinystories-cased"), LIMIT,
                              progress=False)["loss"]


def test_sweep_none_scores_each_artifact_as_stored(artifacts, tmp_path, capsys):
    assert {checkpoint_format(p) for p in artifacts.values()} == {"native", "packed", "compressed", "gguf"}
    out = tmp_path / "r.jsonl"
    stored = [str(artifacts[k]) for k in ("packed", "compressed", "q8_0", "q4_0")]
    assert main(["sweep", *stored, "--target", "none", "--tasks", TASK, "--limit", str(LIMIT), "--out", str(out),
                 "--no-table"]) == 0
    got = {r["checkpoint"]: r for r in read_records(out)}
    assert {(r["bits"], r["target"]) for r in got.values()} == {(16, None)}
    for path in stored:
        assert got[path]["metrics"]["loss"] == pytest.approx(plain_loss(path), abs=1e-6)
    # the packed folder and its compressed-tensors export hold the same codes and scales
    assert got[stored[0]]["metrics"]["loss"] == pytest.approx(got[stored[1]]["metrics"]["loss"], abs=1e-6)
    float_loss = plain_loss(artifacts["float"])
    assert got[stored[0]]["metrics"]["loss"] != pytest.approx(float_loss, abs=1e-6)  # really quantized


@pytest.mark.parametrize("argv, needle", [
    (["--target", "weights-rtn", "--bits", "16", "4"], "--target none"),
    (["--target", "none", "--bits", "16", "4"], "--bits 16 only"),
    (["--target", "none", "--group-size", "32"], "takes no"),
])
def test_quantized_folders_refuse_other_targets_in_one_line(artifacts, tmp_path, capsys, argv, needle):
    code = main(["sweep", str(artifacts["packed"]), *argv, "--tasks", TASK, "--limit", "1",
                 "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1, err


def test_info_on_a_packed_folder_reports_the_full_count_and_the_scheme(artifacts, capsys):
    assert main(["info", str(artifacts["float"])]) == 0
    float_info = json.loads(capsys.readouterr().out)
    assert main(["info", str(artifacts["packed"])]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"]["total"] == float_info["parameters"]["total"]
    assert info["quantization"]["weights"] == {"method": "rtn", "bits": 4, "group_size": 32, "layers": 2 * 7}
    assert main(["info", str(artifacts["compressed"])]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"]["total"] == float_info["parameters"]["total"]
    assert info["quantization"]["weights"]["bits"] == 4 and info["quantization"]["weights"]["group_size"] == 32


def test_compressed_folder_without_tokenizer_needs_one(artifacts, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(artifacts["compressed"], bare)
    (bare / "tokenizer.json").unlink()
    code = main(["sweep", str(bare), "--target", "none", "--tasks", TASK, "--limit", "1",
                 "--out", str(tmp_path / "r.jsonl")])
    assert code == 2 and "--tokenizer" in capsys.readouterr().err
    assert main(["sweep", str(bare), "--target", "none", "--tasks", TASK, "--limit", "1", "--no-table",
                 "--out", str(tmp_path / "r.jsonl"), "--tokenizer", str(default_tokenizer_path())]) == 0


def test_diff_export_records_and_logs_the_o_proj_layers_held_dense(tmp_path, capsys, caplog):
    torch.manual_seed(1)
    model = randomize_(build_model(tiny_config("diff", vocab_size=8192, d_model=64, n_heads=2, max_seq_len=64)))
    save_quantized(quantize(model, QuantConfig(weights=WeightQuant("rtn", 4, 32))), tmp_path / "q",
                   dtype=torch.float32)
    with caplog.at_level("WARNING"):
        assert main(["convert", str(tmp_path / "q"), "--to", "hf", "--out", str(tmp_path / "ct")]) == 0
    held = [f"model.layers.{i}.self_attn.o_proj" for i in range(2)]
    assert json.loads(capsys.readouterr().out)["held_dense"] == held
    from diffquant.checkpoint import read_metadata

    assert json.loads(read_metadata(tmp_path / "ct")["diffquant_dense"]) == held
    assert "stored dense" in caplog.text
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    assert set(held) <= set(config["quantization_config"]["ignore"])
