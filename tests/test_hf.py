"""HF interop: our models <-> transformers' LlamaForCausalLM / DiffLlamaForCausalLM (logits, exact round
trips, refusals, tokenizer files, the CLI) and stories260K from GGUF to HF."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, DiffLlamaConfig, LlamaConfig

from diffquant import build_model, load_checkpoint, save_checkpoint
from diffquant.checkpoint import CheckpointError
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.checkpoint.hf import SIDECAR_FILE, from_hf_model, save_hf, to_hf_model, to_hf_state_dict
from diffquant.cli import main
from diffquant.data import load_documents
from diffquant.generate import greedy_generate
from diffquant.tokenizer import default_tokenizer, tokenizer_for

from .conftest import tiny_config
from .helpers import randomize_, randomize_hf_

ARCH_KV = [("transformer", None), ("transformer", 2), ("diff", None), ("diff", 2)]  # kv 2: GQA in both


def ours(arch, kv=None, **overrides):
    """A random model; for Diff, n_kv_heads=2 on the Transformer side means 2 heads sharing 1 kv head."""
    return randomize_(build_model(tiny_config(arch, n_kv_heads=kv, **overrides))).eval()


def max_logit_gap(model, hf, T=24):
    ids = torch.randint(0, model.config.vocab_size, (2, T))
    with torch.no_grad():
        a, b = model(ids), hf(ids).logits
    return (a - b).abs().max().item(), a.abs().max().item()


def hf_native(model_type, tie=False):
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64,
                  tie_word_embeddings=tie, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    if model_type == "llama":
        cfg = LlamaConfig(num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, **common)
    else:
        cfg = DiffLlamaConfig(num_attention_heads=8, num_key_value_heads=4, head_dim=4, rms_norm_eps=1e-5, **common)
    return randomize_hf_(AutoModelForCausalLM.from_config(cfg))


def params_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# -- ours -> HF -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,kv", ARCH_KV)
def test_converted_hf_model_computes_our_logits(arch, kv):
    model = ours(arch, kv)
    hf = to_hf_model(model)
    assert type(hf).__name__ == ("LlamaForCausalLM" if arch == "transformer" else "DiffLlamaForCausalLM")
    gap, scale = max_logit_gap(model, hf)
    assert gap <= 1e-5 * max(1.0, scale)  # fp32 rounding only (measured ≤ 2.4e-6 relative)
    if arch == "diff":
        assert hf.config.num_attention_heads == 2 * model.config.n_heads  # DiffLlama counts half-heads


@pytest.mark.parametrize("arch,kv", ARCH_KV)
def test_round_trip_through_an_hf_folder_is_bit_exact(arch, kv, tmp_path):
    model = ours(arch, kv)
    save_hf(model, tmp_path / "hf")
    back = load_checkpoint(tmp_path / "hf")
    assert back.config == model.config and params_equal(back, model)


def test_round_trip_in_bfloat16_is_bit_exact(tmp_path):
    model = ours("diff", 2)
    save_hf(model, tmp_path / "hf", dtype=torch.bfloat16)
    assert load_file(str(tmp_path / "hf" / "model.safetensors"))["model.embed_tokens.weight"].dtype == torch.bfloat16
    back = load_checkpoint(tmp_path / "hf", dtype=torch.bfloat16)
    assert params_equal(back, model.to(torch.bfloat16))


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_folder_loads_in_transformers_with_its_tokenizer(arch, tmp_path):
    model = ours(arch, 2, vocab_size=8192)  # the project tokenizer's vocabulary
    save_hf(model, tmp_path / "hf", tokenizer=default_tokenizer())
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # the sidecar file is not read
    gap, scale = max_logit_gap(model, hf.eval())
    assert gap <= 1e-5 * max(1.0, scale)
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    text = load_documents("tinystories-cased")[0].text[:3000]
    assert tok(text, add_special_tokens=False).input_ids == default_tokenizer().encode(text)
    assert tok.eos_token == "<|endoftext|>" and hf.config.eos_token_id == default_tokenizer().eos_id


def test_converted_tokenizer_adds_the_training_bos_by_default(tmp_path):
    """transformers' (and lm-eval's ``hf``) default tokenisation starts with BOS, as our models were trained."""
    mine = default_tokenizer()
    before = mine.backend.to_str()
    save_hf(ours("diff", 2, vocab_size=8192), tmp_path / "hf", tokenizer=mine)
    assert mine.backend.to_str() == before  # the caller's tokenizer is not changed
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    text = "The cat sat on the mat."
    assert tok(text).input_ids == mine.encode(text, bos=True) != mine.encode(text)
    assert tok.bos_token == "<|endoftext|>"


def test_diff_folder_without_its_sidecar_keeps_the_fold(tmp_path, caplog):
    """Without diffquant.safetensors the norm weight stays in o_proj: other parameters, the same outputs."""
    model = ours("diff", 2)
    save_hf(model, tmp_path / "hf")
    (tmp_path / "hf" / SIDECAR_FILE).unlink()
    back = load_checkpoint(tmp_path / "hf")
    assert "stays folded" in caplog.text
    assert torch.equal(back.layers[0].attn.subln.weight, torch.ones(2 * model.config.head_dim))
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    with torch.no_grad():
        gap = (back(ids) - model(ids)).abs().max().item()
        assert gap <= 1e-5 * model(ids).abs().max().item()


def test_sidecar_is_ignored_once_the_hf_weights_changed(tmp_path, caplog):
    model = ours("diff")
    save_hf(model, tmp_path / "hf")
    file = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(str(file))
    tensors["model.layers.1.self_attn.o_proj.weight"][0, 0] += 0.25  # e.g. fine-tuned in HF since
    save_file(tensors, str(file), metadata={"format": "pt"})
    back = load_checkpoint(tmp_path / "hf")
    assert "does not match" in caplog.text
    assert torch.equal(back.layers[1].attn.out_proj.weight, tensors["model.layers.1.self_attn.o_proj.weight"])


# -- HF -> ours -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "diffllama"])
@pytest.mark.parametrize("tie", [False, True])
def test_native_hf_models_convert_exactly_both_ways(model_type, tie):
    hf = hf_native(model_type, tie)
    model = from_hf_model(hf)
    assert model.config.arch == ("transformer" if model_type == "llama" else "diff")
    gap, scale = max_logit_gap(model, hf)
    assert gap <= 1e-5 * max(1.0, scale)
    again = to_hf_state_dict(model)  # HF -> ours -> HF: subln weight 1 folds exactly
    state = {k: v for k, v in hf.state_dict().items() if not (tie and k == "lm_head.weight")}
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)


# -- refusals ---------------------------------------------------------------------------------------------

UNSUPPORTED = {
    "rope scaling": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}},
    "legacy rope scaling": {"rope_scaling": {"type": "linear", "factor": 2.0}},
    "attention bias": {"attention_bias": True},
    "mlp bias": {"mlp_bias": True},
    "activation": {"hidden_act": "gelu"},
    "architecture": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
    "sliding window": {"sliding_window": 16},
    "quantized": {"quantization_config": {"quant_method": "bitsandbytes"}},
}


@pytest.mark.parametrize("what", sorted(UNSUPPORTED))
def test_unsupported_hf_features_give_one_line_errors(what, tmp_path, capsys):
    save_hf(ours("transformer"), tmp_path / "hf")
    cfg_file = tmp_path / "hf" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), **UNSUPPORTED[what]}))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "hf")
    assert "\n" not in str(err.value) and "not" in str(err.value)
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--from", "hf"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_diffllama_with_another_head_norm_eps_is_refused(tmp_path):
    save_hf(ours("diff"), tmp_path / "hf")
    cfg_file = tmp_path / "hf" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "rms_norm_eps": 1e-6}))
    with pytest.raises(CheckpointError, match="rms_norm_eps"):
        load_checkpoint(tmp_path / "hf")
    with pytest.raises(CheckpointError, match="no exact DiffLlama"):
        to_hf_model(ours("diff", norm_eps=1e-6))


def test_pickle_only_folder_is_refused(tmp_path):
    save_hf(ours("transformer"), tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle"):
        load_checkpoint(tmp_path / "hf")


def test_config_transformers_rejects_is_a_one_line_error():
    model = ours("transformer", n_heads=3, head_dim=8)  # HF Llama wants hidden_size % heads == 0
    with pytest.raises(CheckpointError) as err:
        to_hf_model(model)
    assert "\n" not in str(err.value)


# -- GGUF -> HF: the real stories260K ---------------------------------------------------------------------

@pytest.mark.slow
def test_stories260k_from_gguf_to_hf_greedy_is_identical(tmp_path):
    model = load_checkpoint(stories260k_path())
    save_hf(model, tmp_path / "hf", tokenizer=tokenizer_for(stories260k_path()))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    start = tok("", return_tensors="pt").input_ids  # just BOS
    assert start.tolist() == [[1]]
    theirs = hf.generate(start, max_new_tokens=40, do_sample=False)
    assert torch.equal(theirs, greedy_generate(model, start, 40))
    assert tok.decode(theirs[0], skip_special_tokens=True).startswith(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.")
    text = load_documents("tinystories-cased")[0].text[:5000]  # tokenizer.json built from the SentencePiece model
    assert tok(text, add_special_tokens=False).input_ids == tokenizer_for(stories260k_path()).encode(text)


# -- the CLI ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_cli_converts_both_ways(arch, tmp_path, capsys):
    model = ours(arch, 2)
    save_checkpoint(model, tmp_path / "ckpt")
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["architecture"].endswith("LlamaForCausalLM")
    assert "does not fit" in out.err  # the project tokenizer (8192 tokens) cannot serve a 101-token model
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--from", "hf"]) == 0
    back = load_checkpoint(tmp_path / "back")
    assert back.config == model.config and params_equal(back, model)
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--to", "hf"]) == 2  # not empty
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "x"), "--from", "hf"]) == 2  # not HF
    assert capsys.readouterr().err.count("\n") == 2


@pytest.mark.slow
def test_cli_gguf_to_hf_ships_the_tokenizer_and_back(tmp_path, capsys):
    assert main(["convert", str(stories260k_path()), str(tmp_path / "hf"), "--to", "hf", "--dtype", "float16"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] is True
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--from", "hf"]) == 0
    back, ref = load_checkpoint(tmp_path / "back"), load_checkpoint(stories260k_path())
    assert params_equal(back, ref.half().float())  # fp16 is exact both ways once rounded
    ids = np.asarray(tokenizer_for(tmp_path / "back").encode("Once upon a time"))
    assert ids.tolist() == tokenizer_for(stories260k_path()).encode("Once upon a time")
