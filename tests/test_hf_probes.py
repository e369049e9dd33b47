"""Profiling HF causal LMs natively (HFProbed): exact outputs, logits against HF's own probabilities and a
hand-written reference, the converted models' profiles against ours, DiffLlama's two attention calls,
hidden states for other architectures, and stories260K through the CLI."""

import json
import math
import shutil

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DiffLlamaConfig,
    GemmaConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    PhiConfig,
    Qwen2Config,
)

from diffquant import build_model, hooked, load_checkpoint, probes
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.checkpoint.hf import save_hf, to_hf_model
from diffquant.cli import main
from diffquant.data import encode_documents, load_documents
from diffquant.hf_probes import HFProbed, load_for_profiling
from diffquant.profile import profile, token_batches
from diffquant.tokenizer import default_tokenizer_path, tokenizer_for

from .conftest import tiny_config
from .helpers import randomize_, randomize_hf_

V, T = 97, 20
WINDOW = 6
_COMMON = dict(vocab_size=V, num_hidden_layers=2, max_position_embeddings=64)
_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, **_COMMON)
CONFIGS = {
    "llama": lambda: LlamaConfig(**_LLAMA_LIKE),
    "diffllama": lambda: DiffLlamaConfig(**{**_LLAMA_LIKE, "num_attention_heads": 8, "num_key_value_heads": 4,
                                            "head_dim": 4}),
    "mistral": lambda: MistralConfig(sliding_window=None, **_LLAMA_LIKE),
    "qwen2": lambda: Qwen2Config(**_LLAMA_LIKE),
    "gpt2": lambda: GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                               eos_token_id=0),
    "phi": lambda: PhiConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, **_COMMON),
    "gemma": lambda: GemmaConfig(head_dim=8, **_LLAMA_LIKE),
    "gpt_neox": lambda: GPTNeoXConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, **_COMMON),
    "mistral_sliding": lambda: MistralConfig(sliding_window=WINDOW, **_LLAMA_LIKE),  # T = 20 > the window
}
HIDDEN_ONLY = {
    "opt": lambda: OPTConfig(hidden_size=32, ffn_dim=48, num_attention_heads=4, word_embed_proj_dim=32,
                             bos_token_id=0, eos_token_id=0, pad_token_id=1, **_COMMON),
}


def hf_random(model_type):
    factory = {**CONFIGS, **HIDDEN_ONLY}[model_type]
    return randomize_hf_(AutoModelForCausalLM.from_config(factory()))


def ids(n=2, t=T):
    return torch.randint(0, V, (n, t))


def capture(model, x, kinds):
    """Every probe call's tensor, by probe name, in call order."""
    seen = {}
    with torch.no_grad(), hooked(model, lambda n, p, t, c: seen.setdefault(n, []).append(t.clone()), kinds=kinds):
        out = model(x)
    return seen, out


def causal_softmax(logits, window=None):
    keep = torch.ones(logits.shape[-2:], dtype=torch.bool).tril()
    if window is not None:  # HF's sliding_window_overlay: key > query - window
        keep &= ~torch.ones_like(keep).tril(-window)
    return torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)


# -- the wrapper is exact and leaves the model as it was --------------------------------------------------

@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_probed_forward_equals_hf_eager_bit_for_bit(model_type):
    hf = hf_random(model_type)
    x = ids()
    wrapped = HFProbed(hf)
    before = hf.config._attn_implementation
    with torch.no_grad():
        probed = wrapped(x)
        report = profile(wrapped, [x], topk=10, progress=False)
        assert hf.config._attn_implementation == before  # restored after every call
        hf.set_attn_implementation("eager")
        assert torch.equal(probed, hf(x).logits)
        assert torch.equal(wrapped(x), probed)
    assert set(report.sites) == {"attn_logits", "hidden"}


def test_sliding_window_logits_count_inside_the_window_only():
    """Mistral's window: HF's own mask in the softmax, and the probe's mask (observers, quantizers) keeps the
    same entries, so the profile counts T·W − W(W−1)/2 logits per map, not T(T+1)/2."""
    wrapped = HFProbed(hf_random("mistral_sliding"))
    assert probes(wrapped, "attn_logits")["layers.0.attn.logits"].window == WINDOW
    report = profile(wrapped, [ids()], topk=5, progress=False, sites=("attn_logits",))
    per_map = T * WINDOW - WINDOW * (WINDOW - 1) // 2
    assert report.sites["attn_logits"]["count"] == 2 * 2 * 4 * per_map


# -- the logits are the ones HF's softmax sees -------------------------------------------------------------

@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_probed_logits_reproduce_hf_attention_probabilities(model_type):
    hf = hf_random(model_type)
    x = ids()
    seen, _ = capture(HFProbed(hf), x, "attn_logits")
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = hf(x, output_attentions=True).attentions
    assert len(seen) == len(attentions) == 2
    for layer, probs in enumerate(attentions):
        (logits,) = seen[f"layers.{layer}.attn.logits"]  # one call per layer, also for DiffLlama
        if model_type == "diffllama":  # ours (B, H, 2, T, S) -> HF's half-heads (B, 2H, T, S)
            assert logits.shape == (2, 4, 2, T, T)
            logits = logits.transpose(1, 2).flatten(1, 2)
        window = WINDOW if model_type == "mistral_sliding" else None
        torch.testing.assert_close(causal_softmax(logits, window), probs, rtol=0, atol=1e-6)


def test_native_llama_logits_equal_a_hand_written_reference():
    """float64 from the weights: RMSNorm, q/k projections, rotate-half RoPE, GQA, q·kᵀ/√d."""
    hf = hf_random("llama")
    cfg = hf.config
    x = ids()
    report = profile(HFProbed(hf), [x], topk=50, progress=False, sites=("attn_logits",))
    seen, _ = capture(HFProbed(hf), x, "attn_logits")
    with torch.no_grad():
        inputs = hf(x, output_hidden_states=True).hidden_states  # [i] is the input of layer i
    d, H, K = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    inv_freq = cfg.rope_parameters["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rope(t):  # (B, heads, T, d), rotating halves
        return t * cos + torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1) * sin

    pooled = []
    for layer in range(2):
        attn = hf.model.layers[layer].self_attn
        h = inputs[layer].double()
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) \
            * hf.model.layers[layer].input_layernorm.weight.double()
        q = rope((h @ attn.q_proj.weight.double().T).view(2, T, H, d).transpose(1, 2))
        k = rope((h @ attn.k_proj.weight.double().T).view(2, T, K, d).transpose(1, 2))
        ref = q @ k.repeat_interleave(H // K, dim=1).transpose(-1, -2) / math.sqrt(d)  # (B, H, T, T)
        (probed,) = seen[f"layers.{layer}.attn.logits"]
        assert (probed.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
        pooled.append(ref.masked_select(torch.ones(T, T, dtype=torch.bool).tril()).abs())
    ref_top = torch.cat(pooled).topk(50).values
    top = torch.tensor(report.sites["attn_logits"]["top"], dtype=torch.float64)
    assert report.sites["attn_logits"]["count"] == 2 * 2 * H * T * (T + 1) // 2  # causal entries only
    assert ((top - ref_top).abs() / ref_top).max() <= 1e-5


# -- a converted model profiles like the original ----------------------------------------------------------

@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_profile_of_the_converted_hf_model_matches_ours(arch):
    model = randomize_(build_model(tiny_config(arch, n_kv_heads=2))).eval()
    wrapped = HFProbed(to_hf_model(model))
    batches = [torch.randint(0, model.config.vocab_size, (2, T)) for _ in range(2)]  # two batches: sequence ids
    ours = profile(model, batches, topk=30, progress=False)
    theirs = profile(wrapped, batches, topk=30, progress=False)
    chunked = profile(wrapped, batches, topk=30, progress=False, chunk=7)
    assert (wrapped.impl, wrapped.chunk) == ("eager", None)  # profile restores the wrapper's settings
    for site in ("attn_logits", "hidden"):
        a, b, c = (torch.tensor(r.sites[site]["top"]) for r in (ours, theirs, chunked))
        assert ((a - b).abs() / a).max() <= 1e-5 and ((c - b).abs() / b).max() <= 1e-6
        assert ours.sites[site]["count"] == theirs.sites[site]["count"] == chunked.sites[site]["count"]
        where = [{k: v for k, v in loc.items() if k != "value"} for loc in ours.sites[site]["locations"][:5]]
        assert where == [{k: v for k, v in loc.items() if k != "value"} for loc in theirs.sites[site]["locations"][:5]]
    assert theirs.data["model"]["arch"] == arch and theirs.data["model"]["source"] == "hf"


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_a_replacing_hook_acts_on_both_diffllama_value_halves(arch):
    """A quantizer-like hook (round logits to 0.5) changes outputs the same way in ours and in HF."""
    model = randomize_(build_model(tiny_config(arch, n_kv_heads=2))).eval()
    wrapped = HFProbed(to_hf_model(model))
    calls = []

    def coarse(name, probe, t, call):
        calls.append(name)
        return torch.round(t * 2) / 2

    x = torch.randint(0, model.config.vocab_size, (2, T))
    with torch.no_grad():
        with hooked(model, coarse, kinds="attn_logits"):
            ref = model(x)
        calls.clear()
        with hooked(wrapped, coarse, kinds="attn_logits"):
            got = wrapped(x)
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()
        assert (got - model(x)).abs().max() > 1e-3  # the hook did change something
    assert calls == ["layers.0.attn.logits", "layers.1.attn.logits"]  # once per layer, DiffLlama included


# -- hidden states for any decoder-layer architecture ------------------------------------------------------

@pytest.mark.parametrize("model_type", ["gpt_neox", "opt", "gpt2", "llama"])
def test_hidden_states_of_decoder_layers(model_type):
    hf = hf_random(model_type)
    wrapped = HFProbed(hf)
    x = ids()
    seen, _ = capture(wrapped, x, "hidden")
    if wrapped.with_logits:  # the probed attention computes what HF's eager attention does, bit for bit
        hf.set_attn_implementation("eager")
    with torch.no_grad():
        states = hf(x, output_hidden_states=True).hidden_states  # [i + 1]: output of layer i (last one normed)
    assert sorted(seen) == ["layers.0.out", "layers.1.out"]
    assert torch.equal(seen["layers.0.out"][0], states[1])
    if model_type in HIDDEN_ONLY:  # no logit probes where the attention contract is not checked
        assert not probes(wrapped, "attn_logits")
        report = profile(wrapped, [x], topk=5, progress=False)
        assert set(report.sites) == {"hidden"} and report.data["model"]["model_type"] == model_type


# -- stories260K: the CLI (via conversion) and native profiling agree -------------------------------------

@pytest.mark.slow
def test_stories260k_hf_folder_profiles_natively_and_through_the_cli(tmp_path):
    folder = tmp_path / "stories-hf"
    save_hf(load_checkpoint(stories260k_path()), folder, tokenizer=tokenizer_for(stories260k_path()))
    text = tmp_path / "sample.txt"
    text.write_text(load_documents("tinystories-cased")[0].text[:3000])
    out = tmp_path / "p.json"
    argv = [str(folder), "--data", str(text), "--tokens", "512", "--seq-len", "64", "--topk", "20"]
    assert main(["profile", *argv, "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    native = load_for_profiling(folder)
    assert isinstance(native, HFProbed)
    batches = token_batches(encode_documents(tokenizer_for(folder), load_documents(text)), 64, 8, 512)
    report = profile(native, batches, topk=20, progress=False)
    for site in ("attn_logits", "hidden"):
        a, b = torch.tensor(record["sites"][site]["top"]), torch.tensor(report.sites[site]["top"])
        assert ((a - b).abs() / a).max() <= 1e-5
        assert record["sites"][site]["count"] == report.sites[site]["count"]


def test_profile_command_profiles_any_hf_folder_natively(tmp_path):
    """`diffquant profile` loads HF folders with load_for_profiling,
    shown on a GPT-2 folder, which cannot be converted: hidden states and attention logits, HF's tokenizer."""

    folder = tmp_path / "gpt2"
    config = GPT2Config(vocab_size=8192, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    randomize_hf_(AutoModelForCausalLM.from_config(config)).save_pretrained(folder)
    shutil.copyfile(default_tokenizer_path(), folder / "tokenizer.json")
    text = tmp_path / "sample.txt"
    text.write_text(load_documents("tinystories-cased")[0].text[:2000])

    out = tmp_path / "p.json"
    assert main(["profile", str(folder), "--data", str(text), "--tokens", "256", "--seq-len", "32",
                 "--topk", "10", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    assert record["model"]["model_type"] == "gpt2" and set(record["sites"]) == {"attn_logits", "hidden"}
    assert record["tokens"] == 256 and record["sites"]["attn_logits"]["count"] == 8 * 2 * 4 * 32 * 33 // 2


# -- quantizers see the real tokens of a padded batch only -------------------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "diffllama"])
def test_quantized_hf_rows_of_a_padded_batch_equal_the_rows_alone(model_type):
    from diffquant.probes import real_lengths
    from diffquant.quant import ActQuant, QuantConfig, quantize_model

    q = quantize_model(HFProbed(hf_random(model_type)),
                       QuantConfig(logits=ActQuant(4), hidden=ActQuant(6), activations=ActQuant(6, "sequence")))
    x, lengths = ids(3), (T, 7, 12)
    for b, n in enumerate(lengths):
        x[b, n:] = V - 1
    with torch.no_grad():
        with real_lengths(lengths):
            batched = q(x)
        for b, n in enumerate(lengths):
            assert torch.equal(q(x[b:b + 1, :n])[0], batched[b, :n])
