"""Quantize and sweep HF causal LMs that do not convert to ours, natively (diffquant.hf_native): tiny random
Qwen2, Mistral (sliding window), GPT-2, Phi and GPT-NeoX folders; GPT-2's Conv1D against a float64 RTN
reference; logit quantizers that fire (4 bits) and vanish (16 bits); one-line refusals where logits cannot be
observed; `quantize --out` writing a float HF folder with the dequantized weights."""

import json
import shutil

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPTNeoXConfig,
    MistralConfig,
    OPTConfig,
    PhiConfig,
    Qwen2Config,
)

from diffquant import probes
from diffquant.cli import main
from diffquant.data import load_documents
from diffquant.hf_native import is_native_hf, load_native
from diffquant.quant import ActQuant, QuantConfig, WeightQuant, quantize
from diffquant.records import read_records
from diffquant.sweep import run_sweep
from diffquant.tokenizer import default_tokenizer_path

from .helpers import randomize_hf_

V = 8192  # the project tokenizer's vocabulary (the folders ship it)
_COMMON = dict(vocab_size=V, num_hidden_layers=2, max_position_embeddings=64)
_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, **_COMMON)
FAMILIES = {
    "qwen2": lambda: Qwen2Config(**_LLAMA_LIKE),
    "mistral": lambda: MistralConfig(sliding_window=16, **_LLAMA_LIKE),
    "gpt2": lambda: GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                               eos_token_id=0),
    "phi": lambda: PhiConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, **_COMMON),
    "gpt_neox": lambda: GPTNeoXConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, **_COMMON),
    "opt": lambda: OPTConfig(hidden_size=32, ffn_dim=48, num_attention_heads=4, word_embed_proj_dim=32,
                             bos_token_id=0, eos_token_id=0, pad_token_id=1, **_COMMON),
}


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text(load_documents("tinystories-cased")[0].text[:1500])
    return path


def hf_folder(tmp_path, family, seed=0):
    torch.manual_seed(seed)
    folder = tmp_path / family
    randomize_hf_(AutoModelForCausalLM.from_config(FAMILIES[family]())).save_pretrained(folder)
    shutil.copyfile(default_tokenizer_path(), folder / "tokenizer.json")
    return folder


def losses(out):
    return {(r["target"], r["bits"]): r["metrics"]["loss"] for r in read_records(out)}


# -- sweeps ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["qwen2", "mistral", "gpt2", "phi", "gpt_neox"])
def test_sweep_weights_and_logits_on_each_family(tmp_path, text, family):
    folder = hf_folder(tmp_path, family)
    assert is_native_hf(folder)
    out = tmp_path / "records.jsonl"
    for target in ("weights-rtn", "attn_logits"):
        summary = run_sweep([folder], out, target, bits=(16, 8, 4), tasks=[str(text)], limit=2, progress=False)
        assert summary["nonfinite"] == 0
    got = losses(out)
    assert sorted(got, key=str) == sorted([(None, 16), ("weights-rtn", 8), ("weights-rtn", 4),
                                           ("attn_logits", 8), ("attn_logits", 4)], key=str)
    base = got[(None, 16)]
    for target in ("weights-rtn", "attn_logits"):
        assert got[(target, 4)] != base  # the quantizer fired
        assert abs(got[(target, 8)] - base) < abs(got[(target, 4)] - base) + 1e-3


def test_gptq_sweep_on_gpt2_conv1d(tmp_path, text):
    folder = hf_folder(tmp_path, "gpt2")
    out = tmp_path / "records.jsonl"
    run_sweep([folder], out, "weights-gptq", bits=(16, 4), tasks=[str(text)], limit=1, calib_tokens=128,
              progress=False)
    got = losses(out)
    assert set(got) == {(None, 16), ("weights-gptq", 4)} and got[("weights-gptq", 4)] != got[(None, 16)]


# -- exactness -------------------------------------------------------------------------------------------

def test_rtn_on_gpt2_conv1d_equals_a_float64_reference(tmp_path):
    """Conv1D stores W as [in, out]: per output channel = per column; codes ±7 at 4 bits (absmax grid)."""
    model = load_native(hf_folder(tmp_path, "gpt2"))
    q = quantize(model, QuantConfig(weights=WeightQuant("rtn", 4)))
    for layer in range(2):
        for path in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            name = f"transformer.h.{layer}.{path}"
            W = model.hf.get_submodule(name).weight.double()  # [in, out]
            scale = W.abs().amax(dim=0, keepdim=True) / 7
            ref = torch.clamp(torch.round(W / scale), -7, 7) * scale
            got = q.hf.get_submodule(name).dequantized_weight(torch.float64).T
            torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    assert type(q.hf.lm_head) is torch.nn.Linear and type(q.hf.transformer.wte) is torch.nn.Embedding
    x = torch.randint(0, V, (2, 24))
    ref_model = load_native(hf_folder(tmp_path / "ref", "gpt2"))
    with torch.no_grad():
        for layer in range(2):
            for path in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                name = f"transformer.h.{layer}.{path}"
                ref_model.hf.get_submodule(name).weight.copy_(
                    q.hf.get_submodule(name).dequantized_weight(torch.float32).T)
        torch.testing.assert_close(q(x), ref_model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["mistral", "gpt2"])
def test_logits_at_16_bits_equal_the_unquantized_model_and_4_bits_change_it(tmp_path, family):
    model = load_native(hf_folder(tmp_path, family))
    x = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        plain = model(x)
        assert torch.equal(quantize(model, QuantConfig(logits=ActQuant(16))).forward(x), plain)
        four = quantize(model, QuantConfig(logits=ActQuant(4)))
        window = 16 if family == "mistral" else None  # the quantizer's scale sees the window's logits only
        assert probes(four, "attn_logits")["layers.0.attn.logits"].window == window
        assert (four(x) - plain).abs().max() > 1e-3
        assert torch.equal(model(x), plain)  # quantize() left the float model alone


# -- refusals and --out ----------------------------------------------------------------------------------

def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("diffquant: error:")
    return err[0]


def test_unobservable_logits_are_one_line_errors(tmp_path, text, capsys):
    folder = hf_folder(tmp_path, "opt")
    capsys.readouterr()
    out = tmp_path / "records.jsonl"
    assert main(["sweep", str(folder), "--target", "attn_logits", "--bits", "16", "4", "--tasks", str(text),
                 "--out", str(out)]) != 0
    assert "cannot be observed" in _one_error_line(capsys) and not out.exists()
    assert main(["quantize", str(folder), "--logit-bits", "4", "--out", str(tmp_path / "q")]) != 0
    assert "cannot be observed" in _one_error_line(capsys) and not (tmp_path / "q").exists()
    assert main(["sweep", str(folder), "--target", "attn_probs", "--bits", "4", "--tasks", str(text),
                 "--out", str(out)]) != 0
    assert "probes only" in _one_error_line(capsys)


def test_quantize_out_writes_a_float_hf_folder_with_dequantized_weights(tmp_path, capsys):
    folder = hf_folder(tmp_path, "gpt2")
    out = tmp_path / "q"
    assert main(["quantize", str(folder), "--weights", "rtn", "--bits", "4", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "hf-dequantized"
    note = json.loads((out / "diffquant_quant.json").read_text())
    assert note["quant_config"]["weights"]["bits"] == 4 and len(note["dequantized"]) == 8
    assert (out / "tokenizer.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ours = quantize(load_native(folder), QuantConfig(weights=WeightQuant("rtn", 4)))
    x = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        reloaded.set_attn_implementation("eager")
        torch.testing.assert_close(reloaded(x).logits, ours(x), rtol=1e-5, atol=1e-5)
    capsys.readouterr()
    assert main(["quantize", str(folder), "--weights", "rtn", "--bits", "8", "--embeddings", "--out",
                 str(tmp_path / "e")]) == 0
    emb = AutoModelForCausalLM.from_pretrained(tmp_path / "e", local_files_only=True).transformer.wte.weight
    ref = quantize(load_native(folder), QuantConfig(weights=WeightQuant("rtn", 8, embeddings=True)))
    torch.testing.assert_close(emb, ref.hf.transformer.wte.dequantized_weight(torch.float32))
    capsys.readouterr()
    assert main(["quantize", str(folder), "--act-bits", "8", "--out", str(tmp_path / "a")]) != 0
    assert "weight quantization only" in _one_error_line(capsys)
