"""GGUF loading: the real stories260K model (greedy sample, config, loss, an independent float64 reference)
and hand-written GGUF files for round trips and every refusal. Also ``greedy_generate``."""

import json

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffquant import build_model
from diffquant.checkpoint import CheckpointError, load_checkpoint
from diffquant.checkpoint.gguf import load_gguf, read_vocab, stories260k_path, stories260k_tokenizer_path
from diffquant.cli import main
from diffquant.data import encode_documents, load_documents
from diffquant.generate import greedy_generate
from diffquant.tokenizer import Tokenizer

from .conftest import tiny_config
from .helpers import randomize_

# The sample documented for stories260K (greedy from BOS), up to the end of its second sentence.
DOCUMENTED_SAMPLE = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
# Mean loss of the whole cased sample in 256-token windows is 1.841 nats (experiments/stories260k_check.py);
# its first 16 windows score 1.517. A wrongly loaded model lands far above this bound.
LOSS_BOUND = 2.0
WINDOW, N_WINDOWS = 256, 16


@pytest.fixture(scope="module")
def stories():
    return load_checkpoint(stories260k_path())


@pytest.fixture(scope="module")
def stories_sdpa():
    return load_checkpoint(stories260k_path(), attn_impl="sdpa")


@pytest.fixture(scope="module")
def sp():
    return Tokenizer.load(stories260k_tokenizer_path())


@pytest.fixture(scope="module")
def cased_windows(sp):
    """The first 16 contiguous 256-token windows of the cased TinyStories sample (one BOS at the start)."""
    ids = torch.from_numpy(encode_documents(sp, load_documents("tinystories-cased")).astype(np.int64))
    n = N_WINDOWS * WINDOW
    return ids[:n].view(N_WINDOWS, WINDOW), ids[1:n + 1].view(N_WINDOWS, WINDOW)  # inputs, targets


def _loss(model, x, y) -> float:
    with torch.inference_mode():
        return float(F.cross_entropy(model(x).double().flatten(0, 1), y.flatten()))


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's interleaved q/k rows -> HF rotate-half rows (inverse of convert_hf_to_gguf's permute)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, -1).transpose(1, 2).reshape(w.shape)


# -- the real model ---------------------------------------------------------------------------------------

def test_config_read_from_the_file(stories):
    c = stories.config
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (512, 64, 5, 8, 4, 8)
    assert (c.ffn_dim, c.max_seq_len, c.rope_theta, c.norm_eps) == (172, 2048, 10000.0, 1e-5)
    assert c.arch == "transformer" and not c.tie_embeddings  # the file stores output.weight
    assert not stories.training


def test_greedy_sample_from_bos_is_the_documented_one(stories, sp):
    out = greedy_generate(stories, torch.tensor([[sp.bos_id]]), 32)
    assert sp.decode(out[0].tolist()).startswith(DOCUMENTED_SAMPLE)


def test_interleaved_rope_needs_no_permutation(stories, sp):
    """Permuting q/k rows to HF's rotate-half layout (a no-op without RoPE) breaks the sample."""
    wrong = load_gguf(stories260k_path())
    with torch.no_grad():
        for block in wrong.layers:
            block.attn.q_proj.weight.copy_(_unpermute(block.attn.q_proj.weight, wrong.config.n_heads))
            block.attn.k_proj.weight.copy_(_unpermute(block.attn.k_proj.weight, wrong.config.n_kv_heads))
    out = greedy_generate(wrong, torch.tensor([[sp.bos_id]]), 32)
    assert not sp.decode(out[0].tolist()).startswith(DOCUMENTED_SAMPLE)


def _reference_logits(path, ids: torch.Tensor) -> torch.Tensor:
    """float64 Llama forward written from the GGUF tensors alone: HF rotate-half RoPE on un-permuted q/k rows,
    kv head h // n_rep for query head h, RMSNorm, SwiGLU."""
    reader = gguf.GGUFReader(str(path))
    w = {t.name: torch.from_numpy(np.array(t.data, dtype=np.float64)) for t in reader.tensors}
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("llama.")}
    H, K, L = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"], meta["llama.block_count"]
    eps = meta["llama.attention.layer_norm_rms_epsilon"]
    D = w["token_embd.weight"].shape[1]
    d = D // H
    T = ids.shape[1]

    def rms(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g

    freqs = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freqs  # (T, d/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # (T, d)

    def rope(x):  # rotate-half: pairs (i, i + d/2)
        return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin

    x = w["token_embd.weight"][ids]  # (B, T, D)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = (h @ _unpermute(w[p + "attn_q.weight"], H).T).view(-1, T, H, d).transpose(1, 2)  # (B, H, T, d)
        k = (h @ _unpermute(w[p + "attn_k.weight"], K).T).view(-1, T, K, d).transpose(1, 2)  # (B, K, T, d)
        v = (h @ w[p + "attn_v.weight"].T).view(-1, T, K, d).transpose(1, 2)  # (B, K, T, d)
        kv_of = torch.arange(H) // (H // K)
        s = rope(q) @ rope(k)[:, kv_of].transpose(-1, -2) / d ** 0.5  # (B, H, T, T)
        a = s.masked_fill(~causal, float("-inf")).softmax(-1) @ v[:, kv_of]  # (B, H, T, d)
        x = x + a.transpose(1, 2).reshape(-1, T, H * d) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        x = x + (F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


def test_logits_match_an_independent_float64_reference(stories):
    ids = torch.randint(0, 512, (2, 48))
    ref = _reference_logits(stories260k_path(), ids)
    with torch.inference_mode():
        ours = stories(ids).double()
    assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()


def test_eager_and_sdpa_give_the_same_logits(stories, stories_sdpa, cased_windows):
    x = cased_windows[0][:4]
    with torch.inference_mode():
        torch.testing.assert_close(stories_sdpa(x), stories(x), rtol=1e-4, atol=1e-4)


def test_loss_on_the_cased_sample_slice(stories, stories_sdpa, cased_windows):
    x, y = cased_windows
    loss = _loss(stories, x, y)
    assert loss < LOSS_BOUND
    assert abs(_loss(stories_sdpa, x, y) - loss) < 1e-5
    untrained = build_model(stories.config, seed=0)
    assert _loss(untrained, x[:2], y[:2]) > np.log(512) - 0.5  # ≈ uniform over the vocabulary


def test_shipped_sentencepiece_model_is_the_files_vocabulary(sp):
    assert [sp.backend.id_to_piece(i) for i in range(sp.vocab_size)] == read_vocab(stories260k_path())
    assert (sp.bos_id, sp.eos_id) == (1, 2)


# -- hand-written GGUF files ------------------------------------------------------------------------------

_OURS_TO_GGUF = {
    "attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.out_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "attn_norm": "attn_norm", "mlp_norm": "ffn_norm",
}


def _gguf_tensors(model) -> dict[str, np.ndarray]:
    out = {"token_embd.weight": model.embed.weight, "output_norm.weight": model.norm.weight}
    if not model.config.tie_embeddings:
        out["output.weight"] = model.head.weight
    for i, block in enumerate(model.layers):
        for ours, theirs in _OURS_TO_GGUF.items():
            out[f"blk.{i}.{theirs}.weight"] = block.get_submodule(ours).weight
    return {k: v.detach().numpy().copy() for k, v in out.items()}


def _write(path, model, arch="llama", dtype=np.float32, kv=None, tensors=None, quantize=(), eps=True, qtype="Q8_0"):
    """A GGUF file for ``model`` as llama.cpp lays it out; ``kv`` adds metadata, ``tensors`` replaces tensors."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    if eps:
        w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    for key, value in (kv or {}).items():
        getattr(w, key)(value)
    for name, t in {**_gguf_tensors(model), **(tensors or {})}.items():
        if name in quantize:
            qt = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(t, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, t.astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _random_tiny(tie: bool):
    return randomize_(build_model(tiny_config(n_kv_heads=2, tie_embeddings=tie, ffn_dim=96, rope_theta=500.0)))


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_of_a_random_model(tmp_path, tie):
    model = _random_tiny(tie)
    loaded = load_checkpoint(_write(tmp_path / "m.gguf", model))
    assert loaded.config == model.config
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    assert (loaded.head.weight is loaded.embed.weight) == tie


def test_f16_tensors_load_as_their_float32_values(tmp_path):
    model = _random_tiny(False)
    loaded = load_gguf(_write(tmp_path / "m.gguf", model, dtype=np.float16))
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t.half().float()), name
    assert loaded.embed.weight.dtype == torch.float32


def _refused(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_gguf(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize("why, write_kwargs, expected", [
    ("architecture", dict(arch="gpt2"), "architecture 'gpt2'"),
    ("quantized", dict(quantize=("blk.0.ffn_up.weight",), qtype="Q4_1"), "Q4_1"),
    ("rope scaling", dict(kv={"add_rope_scaling_type": gguf.RopeScalingType.LINEAR,
                              "add_rope_scaling_factor": 4.0}), "rope scaling"),
    ("partial rotary", dict(kv={"add_rope_dimension_count": 4}), "partial rotary"),
    ("experts", dict(kv={"add_expert_count": 4}), "mixture-of-experts"),
    ("no rms eps", dict(eps=False), "metadata llama.attention.layer_norm_rms_epsilon is missing"),
])
def test_unsupported_features_are_refused(tmp_path, why, write_kwargs, expected):
    model = build_model(tiny_config(n_kv_heads=2, ffn_dim=96))
    assert expected in _refused(_write(tmp_path / "m.gguf", model, **write_kwargs))


def test_unknown_tensors_and_missing_tensors_are_refused(tmp_path):
    model = build_model(tiny_config())
    bias = np.random.default_rng(0).standard_normal(model.config.q_dim).astype(np.float32)
    assert "blk.0.attn_q.bias" in _refused(_write(tmp_path / "a.gguf", model, tensors={"blk.0.attn_q.bias": bias}))
    shallow = build_model(tiny_config(n_layers=1))
    deep_meta = _write(tmp_path / "b.gguf", shallow, kv={"add_block_count": 2})
    assert "missing layers.1" in _refused(deep_meta)


def test_nan_weights_are_refused(tmp_path):
    model = build_model(tiny_config())
    bad = model.layers[1].mlp.down_proj.weight.detach().numpy().copy()
    bad[3, 5] = np.nan
    assert "NaN" in _refused(_write(tmp_path / "m.gguf", model, tensors={"blk.1.ffn_down.weight": bad}))


@pytest.mark.parametrize("keep", [0.001, 0.01, 0.5, 0.999])
def test_truncated_copies_of_the_real_file_are_refused(tmp_path, keep):
    raw = stories260k_path().read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(raw[: int(len(raw) * keep)])
    assert "corrupt or truncated" in _refused(path)


def test_garbage_and_missing_files_are_refused(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    assert "corrupt or truncated" in _refused(path)
    assert "does not exist" in _refused(tmp_path / "none.gguf")


# -- the CLI ----------------------------------------------------------------------------------------------

def test_info_on_the_gguf_file(capsys):
    assert main(["info", str(stories260k_path())]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["d_model"] == 64 and out["heads"]["kv_heads"] == 4
    assert out["parameters"]["total"] == 64 * 512 * 2 + 64 + 5 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172 + 2 * 64)


def test_info_on_a_garbage_gguf_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"GGUF but not really" * 10)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1


# -- greedy_generate --------------------------------------------------------------------------------------

def test_greedy_generate_picks_the_argmax_at_every_step():
    model = randomize_(build_model(tiny_config()))
    prompt = torch.randint(0, 101, (3, 5))
    out = greedy_generate(model, prompt, 12)
    assert out.shape == (3, 17) and torch.equal(out[:, :5], prompt)
    with torch.inference_mode():
        teacher_forced = model(out[:, :-1]).argmax(-1)  # (3, 16): the argmax after each prefix
    assert torch.equal(teacher_forced[:, 4:], out[:, 5:])


def test_greedy_generate_stops_when_every_row_hit_eos():
    model = randomize_(build_model(tiny_config()))
    prompt = torch.randint(0, 101, (2, 4))
    free = greedy_generate(model, prompt, 8)
    eos = int(free[0, 6])  # row 0's third new token
    first = 4 + int((free[0, 4:] == eos).nonzero()[0])  # where row 0 first emits it
    alone = greedy_generate(model, prompt[:1], 50, eos_id=eos)
    assert torch.equal(alone, free[:1, : first + 1])  # stops right after eos
    both = greedy_generate(model, prompt, 50, eos_id=eos)
    assert torch.equal(both[0, : first + 1], free[0, : first + 1])
    assert torch.all(both[0, first:] == eos)  # a finished row keeps emitting eos while the other runs on
    finished = (both[1, 4:] == eos).cumsum(0) > 0
    assert torch.all(both[1, 4:][finished] == eos)
    assert both.shape[1] == 4 + 50 or bool(finished[-1])


def test_greedy_generate_rejects_bad_arguments():
    model = build_model(tiny_config())
    with pytest.raises(ValueError):
        greedy_generate(model, torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError):
        greedy_generate(model, torch.ones(1, 3, dtype=torch.long), -1)
