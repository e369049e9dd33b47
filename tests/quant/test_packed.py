"""Packed checkpoints: save -> load gives the very same model, codes are really packed, errors are one line."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffquant import CheckpointError, build_model
from diffquant.checkpoint import load_quantized, save_quantized
from diffquant.quant import ActQuant, QuantConfig, QuantLinear, WeightQuant, quantize_model
from tests.conftest import tiny_config
from tests.helpers import randomize_

CONFIGS = {
    "rtn4-g16": QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=16)),
    "rtn4-g24-ragged": QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=24)),  # widths 32, 64: 24+8, 24+24+16
    "gptq3-g24-ragged-asym": QuantConfig(weights=WeightQuant("gptq", bits=3, group_size=24, symmetric=False)),
    "hadamard-g24-ragged": QuantConfig(weights=WeightQuant("hadamard-rtn", bits=4, group_size=24)),
    "gptq6-asym-act": QuantConfig(weights=WeightQuant("gptq", bits=6, symmetric=False, act_order=True),
                                  activations=ActQuant(8, "token")),
    "rtn3-embeddings": QuantConfig(weights=WeightQuant("rtn", bits=3, group_size=8, embeddings=True),
                                   logits=ActQuant(4)),
    "acts-only": QuantConfig(logits=ActQuant(4, "head"), probs=ActQuant(8), qk=ActQuant(6), hidden=ActQuant(8),
                             activations=ActQuant(8)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_save_then_load_gives_identical_logits(arch, name, tmp_path):
    q = quantize_model(randomize_(build_model(tiny_config(arch))), CONFIGS[name],
                       calib=torch.randint(0, 101, (8, 12))).eval()
    save_quantized(q, tmp_path / "q")
    loaded = load_quantized(tmp_path / "q")
    ids = torch.randint(0, 101, (3, 17))
    with torch.no_grad():
        assert torch.equal(loaded(ids), q(ids))
    assert [(n, type(m)) for n, m in loaded.named_modules()] == [(n, type(m)) for n, m in q.named_modules()]
    assert loaded.quant_config == CONFIGS[name] and not loaded.training


def test_codes_on_disk_are_packed_and_described_by_quant_json(tmp_path):
    q = quantize_model(build_model(tiny_config()), QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=16)))
    q.layers[1].mlp.down_proj = QuantLinear.from_float(torch.nn.Linear(64, 32, bias=False), 6)
    save_quantized(q, tmp_path / "q")
    tensors = load_file(str(tmp_path / "q" / "model.safetensors"))
    info = json.loads((tmp_path / "q" / "quant.json").read_text())
    assert tensors["layers.0.attn.q_proj.qweight"].dtype == torch.uint8
    assert tensors["layers.0.attn.q_proj.qweight"].shape == (32, 16)  # 32 inputs, two 4-bit codes per byte
    assert tensors["layers.0.attn.q_proj.scale"].shape == (32, 2)
    assert tensors["layers.1.mlp.down_proj.qweight"].shape == (32, 64)  # 6-bit: one code per byte
    scheme = info["modules"]["layers.0.attn.q_proj"]
    assert scheme == {"type": "QuantLinear", "in_features": 32, "out_features": 32, "bias": False, "bits": 4,
                      "group_size": 16, "symmetric": True, "storage": "uint4x2", "act": None}
    assert info["modules"]["layers.1.mlp.down_proj"]["storage"] == "uint8" and "6-bit" in info["notes"]["uint8"]
    assert info["shared"] == {"head.weight": "embed.weight"}  # the tied float head is stored once
    assert "head.weight" not in tensors


def test_tied_quantized_codes_are_stored_once_and_tied_again(tmp_path):
    q = quantize_model(randomize_(build_model(tiny_config("diff"))),
                       QuantConfig(weights=WeightQuant("rtn", bits=4, embeddings=True)))
    save_quantized(q, tmp_path / "q")
    tensors = load_file(str(tmp_path / "q" / "model.safetensors"))
    assert "embed.qweight" in tensors and "head.qweight" not in tensors
    loaded = load_quantized(tmp_path / "q")
    assert loaded.head.qweight is loaded.embed.qweight


def test_a_4bit_checkpoint_is_smaller_than_fp16(tmp_path):
    model = build_model(tiny_config(d_model=64, n_heads=4, vocab_size=101))
    q = quantize_model(model, QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=32, embeddings=True)))
    save_quantized(q, tmp_path / "q")
    fp16_bytes = 2 * sum(p.numel() for p in model.parameters())
    assert (tmp_path / "q" / "model.safetensors").stat().st_size < 0.4 * fp16_bytes


def test_refuses_a_non_empty_folder_and_writes_atomically(tmp_path):
    q = quantize_model(build_model(tiny_config()), QuantConfig(weights=WeightQuant("rtn", bits=8)))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    with pytest.raises(CheckpointError, match="not empty"):
        save_quantized(q, tmp_path / "busy")
    save_quantized(q, tmp_path / "busy", overwrite=True)
    assert not (tmp_path / "busy" / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]  # no temporary folders left behind


@pytest.fixture
def saved(tmp_path):
    q = quantize_model(build_model(tiny_config()), QuantConfig(weights=WeightQuant("rtn", bits=4),
                                                               logits=ActQuant(4)))
    return save_quantized(q, tmp_path / "q")


def edit_json(path, change):
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


@pytest.mark.parametrize("break_it, words", [
    (lambda p: (p / "quant.json").write_text("{oops"), "not valid JSON"),
    (lambda p: edit_json(p / "quant.json", lambda i: i.update(version=99)), "version"),
    (lambda p: edit_json(p / "quant.json", lambda i: i.update(format="other")), "is not a diffquant-packed"),
    (lambda p: edit_json(p / "quant.json", lambda i: i["modules"]["layers.0.attn.q_proj"].update(type="Magic")),
     "unknown module type"),
    (lambda p: edit_json(p / "quant.json", lambda i: i["modules"]["layers.0.attn.q_proj"].update(group_size=16)),
     "does not match the weights"),
    (lambda p: edit_json(p / "quant.json", lambda i: i["modules"]["layers.0.attn.logits"].update(kind="hidden")),
     "no hidden probe"),
    (lambda p: (p / "model.safetensors").write_bytes(b"garbage"), "corrupt"),
    (lambda p: save_file({k: v for k, v in load_file(str(p / "model.safetensors")).items()
                          if k != "layers.1.mlp.up_proj.scale"}, str(p / "model.safetensors")), "missing"),
])
def test_broken_checkpoints_are_one_line_errors(saved, break_it, words):
    break_it(saved)
    with pytest.raises(CheckpointError) as excinfo:
        load_quantized(saved)
    assert words in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_loading_attention_quantizers_with_sdpa_is_refused(saved):
    with pytest.raises(CheckpointError, match="eager"):
        load_quantized(saved, attn_impl="sdpa")
    assert load_quantized(saved, attn_impl="eager").config.attn_impl == "eager"


def test_an_fp16_save_loads_as_the_model_with_its_float_tensors_rounded(tmp_path):
    q = quantize_model(randomize_(build_model(tiny_config("diff"))),
                       QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=16), logits=ActQuant(8)))
    save_quantized(q, tmp_path / "q", dtype=torch.float16)
    assert load_file(str(tmp_path / "q" / "model.safetensors"))["layers.0.attn.q_proj.scale"].dtype == torch.float16
    rounded = copy.deepcopy(q).half().float()  # codes untouched, scales and norms through fp16
    ids = torch.randint(0, 101, (2, 10))
    with torch.no_grad():
        assert torch.equal(load_quantized(tmp_path / "q")(ids), rounded(ids))
        assert not torch.equal(rounded(ids), q(ids))
