"""Hugging Face interoperability: our models <-> ``LlamaForCausalLM`` / ``DiffLlamaForCausalLM`` folders.

A diffquant Transformer becomes a Llama folder and a Diff model a DiffLlama folder (config.json,
model.safetensors, tokenizer.json + tokenizer_config.json) that transformers loads offline with no custom code.
The weights need three changes, all exact except the last:

* **RoPE pairing.** We rotate interleaved pairs (x[2i], x[2i+1]) (official Diff code, llama.cpp); HF rotates
  halves (x[i], x[i+d/2]). Permuting each q/k head's rows — even rows first, then odd rows, the inverse of the
  ``permute`` in HF's convert_llama_weights_to_hf — makes HF's rotation ours; q·kᵀ (so every attention logit)
  is unchanged because q and k get the same permutation.
* **DiffLlama's head layout.** It counts d-wide half-heads (``num_attention_heads`` = 2·n_heads) and pairs
  half-head i with i + N/2, where we interleave sub-heads 2i, 2i+1: q/k rows (and the d-wide halves of each
  2d-wide value head) are reordered evens-then-odds. Its value split — first N_kv/2 kv half-heads, then the
  rest, each repeated for both maps — then gives head i the value [v_c ; v_(c+K)], which is exactly our 2d-wide
  value of kv head c, so o_proj keeps our column order.
* **The head norm.** DiffLlama's per-head RMSNorm has no weight (and uses ``rms_norm_eps``): our subln weight
  is folded into o_proj's columns. Multiplying rounds, so the fold cannot be undone bit-exactly; the folder
  therefore also carries ``diffquant.safetensors`` (ignored by transformers) with the unfolded out_proj and
  subln weights and our config. Loading uses it only when re-folding it reproduces o_proj bit for bit (the
  HF weights were not changed since); otherwise the model gets subln weight 1 and the folded o_proj — the same
  function, different parameters.

λ_init (0.8 − 0.6·exp(−0.3·l), 0-based l), λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init and the (1 − λ_init)
factor are the same formulas in both. What DiffLlama cannot express (a head-norm eps other than
``rms_norm_eps``), and HF features we lack (RoPE scaling, partial rotary, biases, sliding windows, other
activations or architectures, quantized or pickled weights), raise a one-line ``CheckpointError``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from ..config import ModelConfig
from ..errors import first_line
from ..io import write_safetensors
from ..model import LAMBDA_STD, LM, build_model
from .files import (
    CONFIG_FILE,
    FLOAT_DTYPES,
    INDEX_FILE,
    SENTENCEPIECE_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    atomic_folder,
    check_header,
    check_shapes,
    read_header,
    read_json,
    read_tensors,
    refuse_pickle,
)

log = logging.getLogger(__name__)

ARCHITECTURES = {"transformer": ("llama", "LlamaForCausalLM"), "diff": ("diffllama", "DiffLlamaForCausalLM")}
MODEL_TYPES = {model_type: arch for arch, (model_type, _) in ARCHITECTURES.items()}
SIDECAR_FILE = "diffquant.safetensors"  # exact originals of what the fold changes; transformers ignores it
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SUBLN_EPS = 1e-5  # our Diff head norm's eps (model.py), which DiffLlama takes from rms_norm_eps


def is_hf_folder(path: str | Path) -> bool:
    """A folder whose config.json is a transformers config (it names ``model_type`` or ``architectures``)."""
    cfg_file = Path(path) / CONFIG_FILE
    if not cfg_file.is_file():
        return False
    try:
        data = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)


# -- ours -> HF -------------------------------------------------------------------------------------------

def hf_config_dict(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None,
                   dtype: torch.dtype = torch.float32) -> dict:
    """The transformers config (as keyword arguments) of the Llama / DiffLlama that computes what ``cfg`` does."""
    if cfg.arch not in ARCHITECTURES:
        raise CheckpointError(f"transformers has no architecture that computes the {cfg.arch!r} arm; only "
                              f"{' and '.join(ARCHITECTURES)} models convert to HF folders")
    model_type, architecture = ARCHITECTURES[cfg.arch]
    if cfg.arch == "diff" and cfg.norm_eps != SUBLN_EPS:
        raise CheckpointError(
            f"DiffLlama uses rms_norm_eps ({cfg.norm_eps}) also in its head norm, whose eps is {SUBLN_EPS} in our "
            "Diff model: this model has no exact DiffLlama equivalent")
    if cfg.arch == "diff" and cfg.lambda_init is not None:
        raise CheckpointError(f"DiffLlama has no constant lambda_init ({cfg.lambda_init}): only the paper's "
                              "per-layer schedule converts")
    sub = cfg.sub_heads_per_head  # DiffLlama counts d-wide half-heads
    return dict(
        model_type=model_type, architectures=[architecture], vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_dim, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads * sub,
        num_key_value_heads=cfg.n_kv_heads * sub, head_dim=cfg.head_dim, hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, attention_bias=False,
        attention_dropout=0.0, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=None,
        dtype=str(dtype).removeprefix("torch."),
        **({"mlp_bias": False} if cfg.arch == "transformer" else {"lambda_std_dev": LAMBDA_STD}),  # init only
    )


def hf_config(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None,
              dtype: torch.dtype = torch.float32):
    """A transformers ``PreTrainedConfig`` for ``cfg`` (its own validation errors become CheckpointError)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    kwargs = hf_config_dict(cfg, bos_id, eos_id, dtype)
    try:
        return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    except (ValueError, TypeError, StrictDataclassError) as exc:  # StrictDataclassError: transformers' validators
        raise CheckpointError(f"transformers refuses this config: {first_line(exc.__cause__ or exc)}") from None


def _rows(n_chunks: int, d: int, diff: bool, rope: bool) -> torch.Tensor:
    """Row order of an HF projection in terms of ours: ``hf = ours[_rows(...)]``.

    ``n_chunks`` d-wide row blocks (sub-heads); Diff puts the even blocks (map 1) before the odd ones (map 2);
    ``rope`` reorders each block's rows evens-then-odds (interleaved pairs -> rotate-half pairs).
    """
    blocks = torch.cat((torch.arange(0, n_chunks, 2), torch.arange(1, n_chunks, 2))) if diff else torch.arange(n_chunks)
    within = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2))) if rope else torch.arange(d)
    return (blocks[:, None] * d + within[None, :]).flatten()


def _row_maps(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    diff, sub, d = cfg.arch == "diff", cfg.sub_heads_per_head, cfg.head_dim
    return {"q_proj": _rows(cfg.n_heads * sub, d, diff, rope=True),
            "k_proj": _rows(cfg.n_kv_heads * sub, d, diff, rope=True),
            "v_proj": _rows(cfg.n_kv_heads * sub, d, diff, rope=False)}


def _fold(out_w: torch.Tensor, subln_w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """o_proj of DiffLlama: our out_proj with each head's 2d columns scaled by the subln weight (fp32 product)."""
    return (out_w.float() * subln_w.float().repeat(n_heads)).to(out_w.dtype)


_MLP = ("gate_proj", "up_proj", "down_proj")


def to_hf_state_dict(model: LM, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our weights under HF names and layouts (new tensors; ``model`` is untouched)."""
    cfg = model.config
    ours = {k: (v.detach().to(dtype) if dtype is not None else v.detach()) for k, v in model.state_dict().items()}
    rows = _row_maps(cfg)
    out = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = ours["head.weight"]
    for i in range(cfg.n_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        for name, order in rows.items():
            out[f"{h}self_attn.{name}.weight"] = ours[f"{p}attn.{name}.weight"][order]
        o_proj = ours[f"{p}attn.out_proj.weight"]
        if cfg.arch == "diff":
            o_proj = _fold(o_proj, ours[f"{p}attn.subln.weight"], cfg.n_heads)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                out[f"{h}self_attn.{name}"] = ours[f"{p}attn.{name}"]
        out[f"{h}self_attn.o_proj.weight"] = o_proj
        out[f"{h}input_layernorm.weight"] = ours[f"{p}attn_norm.weight"]
        out[f"{h}post_attention_layernorm.weight"] = ours[f"{p}mlp_norm.weight"]
        for name in _MLP:
            out[f"{h}mlp.{name}.weight"] = ours[f"{p}mlp.{name}.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def to_hf_model(model: LM, dtype: torch.dtype | None = None):
    """An in-memory transformers model (eval mode) computing what ``model`` computes."""
    from transformers import AutoModelForCausalLM

    cfg = model.config
    dtype = dtype or model.embed.weight.dtype
    hf = AutoModelForCausalLM.from_config(hf_config(cfg, dtype=dtype), dtype=dtype)
    state = to_hf_state_dict(model, dtype)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_embeddings)]
    if missing or unexpected:  # a mapping bug, never user input
        raise RuntimeError(f"HF state mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    hf.tie_weights()
    return hf.eval()


def save_hf(model: LM, path: str | Path, tokenizer=None, overwrite: bool = False,
            dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` as an HF folder (atomically); ``tokenizer``: a diffquant ``Tokenizer`` to ship with it."""
    path, cfg = Path(path), model.config
    with atomic_folder(path, overwrite) as tmp:  # the overwrite guard comes first
        if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
            raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens; the model only "
                                  f"{cfg.vocab_size}")
        dtype = dtype or model.embed.weight.dtype
        bos, eos = (tokenizer.bos_id, tokenizer.eos_id) if tokenizer is not None else (None, None)
        config = hf_config(cfg, bos, eos, dtype)
        tensors = to_hf_state_dict(model, dtype)
        config.save_pretrained(tmp)
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        _save_sidecar(model, tmp / SIDECAR_FILE, dtype)
        if tokenizer is not None:
            _save_tokenizer(tokenizer, tmp, cfg.max_seq_len)
    log.info("saved %s as %s (%d tensors)", path, ARCHITECTURES[cfg.arch][1], len(tensors))
    return path


def _save_sidecar(model: LM, file: Path, dtype: torch.dtype) -> None:
    """Our config, and for Diff the unfolded out_proj and subln weights: what makes the way back bit-exact."""
    tensors = {}
    if model.config.arch == "diff":
        for i, block in enumerate(model.layers):
            tensors[f"layers.{i}.attn.out_proj.weight"] = block.attn.out_proj.weight.detach().to(dtype).contiguous()
            tensors[f"layers.{i}.attn.subln.weight"] = block.attn.subln.weight.detach().to(dtype).contiguous()
    write_safetensors(tensors, file, metadata={"format": "pt", "diffquant_config": model.config.to_json()})


# -- tokenizer files --------------------------------------------------------------------------------------

def _save_tokenizer(tokenizer, folder: Path, max_len: int) -> None:
    """tokenizer.json (+ tokenizer.model for SentencePiece) and a minimal tokenizer_config.json for AutoTokenizer."""
    source = Path(tokenizer.path) if tokenizer.path else None
    if tokenizer.kind == "hf":
        backend = _tokenizers().Tokenizer.from_str(tokenizer.backend.to_str())  # a copy: the caller's stays as is
        if tokenizer.bos_id is not None:  # our models are trained with BOS before every document
            _add_bos(backend, backend.id_to_token(tokenizer.bos_id), tokenizer.bos_id)
        backend.save(str(folder / TOKENIZER_FILE))
        specials = {}
    else:
        backend = sentencepiece_to_tokenizers(tokenizer)
        backend.save(str(folder / TOKENIZER_FILE))
        shutil.copyfile(source, folder / SENTENCEPIECE_FILE)  # the original, for SentencePiece users
        specials = {"unk_token": backend.id_to_token(tokenizer.backend.unk_id())}
    backend = _tokenizers().Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    for name, i in (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id)):
        if i is not None:
            specials[name] = backend.id_to_token(i)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, **specials}
    (folder / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def sentencepiece_to_tokenizers(tokenizer):
    """A ``tokenizers.Tokenizer`` equal to a SentencePiece **BPE** model (Llama-2 style tokenizer.json).

    Built from the pieces and scores alone (transformers' own converter needs protobuf): merges are recovered
    from the vocabulary ranked by score, as transformers does for GGUF files; byte fallback, "▁" for spaces,
    BOS added by the post-processor. Checked on a probe text: a mismatch (e.g. a unigram model) raises.
    """
    tk = _tokenizers()
    sp = tokenizer.backend
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    ranked = []
    for i, piece in enumerate(pieces):  # every split of a piece into two pieces is a merge, ranked by its score
        splits = [(piece[:j], piece[j:]) for j in range(1, len(piece)) if piece[:j] in vocab and piece[j:] in vocab]
        splits.sort(key=lambda ab: (vocab[ab[0]], vocab[ab[1]]))
        ranked += [(sp.get_score(i), a, b) for a, b in splits]
    ranked.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)  # stable: ties keep the order above
    unk = pieces[sp.unk_id()] if sp.unk_id() >= 0 else None
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[(a, b) for _, a, b in ranked], unk_token=unk,
                                     fuse_unk=True, byte_fallback=True))
    tok.normalizer = tk.normalizers.Sequence([tk.normalizers.Prepend("▁"), tk.normalizers.Replace(" ", "▁")])
    tok.decoder = tk.decoders.Sequence([tk.decoders.Replace("▁", " "), tk.decoders.ByteFallback(),
                                        tk.decoders.Fuse(), tk.decoders.Strip(" ", 1, 0)])
    specials = [pieces[i] for i in range(len(pieces)) if sp.is_control(i) or sp.is_unknown(i)]
    tok.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in specials])
    if tokenizer.bos_id is not None:
        _add_bos(tok, pieces[tokenizer.bos_id], tokenizer.bos_id)
    probe = "Once upon a time, a  little café owner said: \"Hello\tworld!\"\n\n 42 × ünïcödé 😀 "
    if tok.encode(probe, add_special_tokens=False).ids != sp.encode(probe):
        raise CheckpointError(f"cannot express the SentencePiece model {tokenizer.path} as tokenizer.json "
                              "(not a BPE model?)")
    return tok


def _add_bos(tok, bos: str, bos_id: int) -> None:
    """BOS before every sequence when special tokens are added (what transformers and lm-eval's ``hf`` do by
    default), as the models saw in training."""
    tok.post_processor = _tokenizers().processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])


def _tokenizers():
    import tokenizers

    return tokenizers


# -- HF -> ours -------------------------------------------------------------------------------------------

def config_from_hf(hf: dict, source: str = "HF config") -> ModelConfig:
    """Our config for a Llama / DiffLlama config dict; anything we cannot compute exactly raises."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{source}: model_type {model_type!r} cannot be converted (only {', '.join(MODEL_TYPES)}); "
            "profile it natively with diffquant.hf_probes")
    _refuse_unsupported(hf, source)
    arch = MODEL_TYPES[model_type]
    heads, kv = int(hf["num_attention_heads"]), int(hf.get("num_key_value_heads") or hf["num_attention_heads"])
    d_model = int(hf["hidden_size"])
    head_dim = int(hf.get("head_dim") or d_model // heads)
    if arch == "diff":
        if heads % 2 or kv % 2:
            raise CheckpointError(f"{source}: DiffLlama needs even half-head counts, got {heads}/{kv}")
        heads, kv = heads // 2, kv // 2
    ffn = int(hf["intermediate_size"])
    try:
        return ModelConfig(
            arch=arch, vocab_size=int(hf["vocab_size"]), d_model=d_model, n_layers=int(hf["num_hidden_layers"]),
            n_heads=heads, n_kv_heads=kv, head_dim=head_dim, ffn_dim=ffn,
            max_seq_len=int(hf.get("max_position_embeddings", 2048)), rope_theta=float(_rope(hf)["rope_theta"]),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6 if arch == "transformer" else 1e-5)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: invalid model config ({first_line(exc)})") from None


def _rope(hf: dict) -> dict:
    """RoPE settings from transformers 5 (``rope_parameters``) or 4 (``rope_theta`` / ``rope_scaling``) configs."""
    params = dict(hf.get("rope_parameters") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    legacy = hf.get("rope_scaling")
    if legacy:  # any scaling, even beside a "default" rope_parameters
        params["rope_type"] = legacy.get("rope_type", legacy.get("type", "scaled")) if isinstance(legacy, dict) \
            else "scaled"
    return params


def _refuse_unsupported(hf: dict, source: str) -> None:
    rope = _rope(hf)
    checks = [
        (rope.get("rope_type", "default") != "default", f"rope scaling ({rope.get('rope_type')})"),
        (float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor") or 1.0)) != 1.0,
         "partial rotary embeddings"),
        (bool(hf.get("attention_bias")), "attention biases"),
        (bool(hf.get("mlp_bias")), "MLP biases"),
        (hf.get("hidden_act", "silu") != "silu", f"activation {hf.get('hidden_act')!r} (only silu)"),
        (hf.get("sliding_window") is not None, "sliding-window attention"),
        (hf.get("quantization_config") is not None, "quantized weights"),
        (hf.get("model_type") == "diffllama" and float(hf.get("rms_norm_eps", 1e-5)) != SUBLN_EPS,
         f"rms_norm_eps {hf.get('rms_norm_eps')} in DiffLlama's head norm (ours is fixed at {SUBLN_EPS})"),
    ]
    for bad, what in checks:
        if bad:
            raise CheckpointError(f"{source}: {what} is not supported")


def from_hf_state_dict(tensors: dict[str, torch.Tensor], cfg: ModelConfig, source: str = "HF weights"
                       ) -> dict[str, torch.Tensor]:
    """Our state dict from HF tensors (inverse of :func:`to_hf_state_dict` with subln weight 1)."""
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}  # old checkpoints
    if cfg.tie_embeddings:
        head = tensors.pop("lm_head.weight", None)  # tied: equal to the embedding, or a different model
        if head is not None and not torch.equal(head, tensors.get("model.embed_tokens.weight", head)):
            raise CheckpointError(f"{source}: tie_word_embeddings is true but the stored lm_head.weight differs "
                                  "from model.embed_tokens.weight; set tie_word_embeddings to false to use it")
    check_shapes(Path(source), _hf_shapes(cfg), {k: v.shape for k, v in tensors.items()})
    inverse = {name: torch.argsort(order) for name, order in _row_maps(cfg).items()}
    out = {"embed.weight": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    if not cfg.tie_embeddings:
        out["head.weight"] = tensors["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        for name, order in inverse.items():
            out[f"{p}attn.{name}.weight"] = tensors[f"{h}self_attn.{name}.weight"][order]
        out[f"{p}attn.out_proj.weight"] = tensors[f"{h}self_attn.o_proj.weight"]
        if cfg.arch == "diff":
            out[f"{p}attn.subln.weight"] = torch.ones(2 * cfg.head_dim, dtype=out["embed.weight"].dtype)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                out[f"{p}attn.{name}"] = tensors[f"{h}self_attn.{name}"]
        out[f"{p}attn_norm.weight"] = tensors[f"{h}input_layernorm.weight"]
        out[f"{p}mlp_norm.weight"] = tensors[f"{h}post_attention_layernorm.weight"]
        for name in _MLP:
            out[f"{p}mlp.{name}.weight"] = tensors[f"{h}mlp.{name}.weight"]
    return out


def _hf_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Name -> shape of every tensor an HF folder for ``cfg`` must hold."""
    V, D, F, d = cfg.vocab_size, cfg.d_model, cfg.ffn_dim, cfg.head_dim
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (V, D)
    for i in range(cfg.n_layers):
        h = f"model.layers.{i}."
        shapes.update({f"{h}self_attn.q_proj.weight": (cfg.q_dim, D), f"{h}self_attn.k_proj.weight": (cfg.kv_dim, D),
                       f"{h}self_attn.v_proj.weight": (cfg.kv_dim, D), f"{h}self_attn.o_proj.weight": (D, cfg.q_dim),
                       f"{h}input_layernorm.weight": (D,), f"{h}post_attention_layernorm.weight": (D,),
                       f"{h}mlp.gate_proj.weight": (F, D), f"{h}mlp.up_proj.weight": (F, D),
                       f"{h}mlp.down_proj.weight": (D, F)})
        if cfg.arch == "diff":
            shapes.update({f"{h}self_attn.{n}": (d,) for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})
    return {k: torch.Size(v) for k, v in shapes.items()}


def from_hf_model(hf_model) -> LM:
    """Our model (eval mode) from an in-memory transformers Llama / DiffLlama model."""
    cfg = config_from_hf(hf_model.config.to_dict(), type(hf_model).__name__)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return _build(cfg, from_hf_state_dict(state, cfg, type(hf_model).__name__))


def _build(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> LM:
    model = build_model(cfg)
    model.load_state_dict(state, strict=False)  # strict=False only for the tied head (names were checked)
    return model.eval()


def read_hf_config(path: str | Path) -> ModelConfig:
    """Our config for the HF folder ``path`` (no tensor is read)."""
    return config_from_hf(read_json(Path(path) / CONFIG_FILE), str(path))


def load_hf(path: str | Path) -> LM:
    """Our model from a Llama / DiffLlama HF folder (safetensors only), bit-exact for folders we wrote."""
    path = Path(path)
    hf = read_json(path / CONFIG_FILE)
    cfg = config_from_hf(hf, str(path))
    _check_hf_header(path, cfg)
    tensors = _read_hf_tensors(path)
    state = from_hf_state_dict(tensors, cfg, str(path))
    cfg, state = _apply_sidecar(path, cfg, state, tensors)
    log.info("loaded HF %s from %s", hf.get("model_type"), path)
    return _build(cfg, state)


def weight_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json lists, each resolved inside ``path``;
    never pickle files."""
    refuse_pickle(path)
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    if not (path / INDEX_FILE).is_file():
        raise CheckpointError(f"{path} has no {WEIGHTS_FILE}")
    weight_map = read_json(path / INDEX_FILE).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path / INDEX_FILE} lists no weight files")
    return [_shard(path, name) for name in sorted(set(map(str, weight_map.values())))]


def _shard(path: Path, name: str) -> Path:
    """A shard named by the index: a .safetensors file inside the folder (no ``..``, no absolute path)."""
    folder = path.resolve()
    file = (folder / name).resolve()
    if folder not in file.parents or file.suffix != ".safetensors":
        raise CheckpointError(f"{path / INDEX_FILE} names {name!r}, which is not a .safetensors file inside {path}")
    return file


def _check_hf_header(path: Path, cfg: ModelConfig) -> None:
    """Declared tensors against the config before anything is read (HF names, tied head and inv_freq aside)."""
    declared = {}
    for file in weight_files(path):
        declared.update(read_header(file))
    declared = {k: v for k, v in declared.items() if not k.endswith("rotary_emb.inv_freq")
                and not (cfg.tie_embeddings and k == "lm_head.weight")}
    check_header(path, _hf_shapes(cfg), declared, dtypes=FLOAT_DTYPES)


def _read_hf_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in weight_files(path):
        tensors.update(read_tensors(file))
    return tensors


def _apply_sidecar(path: Path, cfg: ModelConfig, state: dict, tensors: dict) -> tuple[ModelConfig, dict]:
    """Restore our config and the unfolded Diff weights when the sidecar still describes these HF weights."""
    file = path / SIDECAR_FILE
    if not file.is_file():
        if cfg.arch == "diff":
            log.warning("%s: no %s; the head norm stays folded into o_proj (subln weight 1)", path, SIDECAR_FILE)
        return cfg, state
    read_header(file)
    with safe_open(str(file), framework="pt") as fh:
        meta = fh.metadata() or {}
        extra = {k: fh.get_tensor(k) for k in fh.keys()}
    try:
        saved = ModelConfig.from_json_text(meta["diffquant_config"])
    except (KeyError, ValueError, TypeError):
        log.warning("%s: unreadable %s; ignored", path, SIDECAR_FILE)
        return cfg, state
    if not _same_model(saved, cfg) or not _fold_matches(saved, extra, tensors):
        log.warning("%s: %s does not match the HF weights (edited since conversion?); ignored", path, SIDECAR_FILE)
        return cfg, state
    return saved, {**state, **extra}


def _same_model(a: ModelConfig, b: ModelConfig) -> bool:
    keys = ("arch", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
            "max_seq_len", "rope_theta", "norm_eps", "tie_embeddings")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _fold_matches(cfg: ModelConfig, extra: dict, tensors: dict) -> bool:
    if cfg.arch != "diff":
        return not extra
    try:
        return all(torch.equal(_fold(extra[f"layers.{i}.attn.out_proj.weight"], extra[f"layers.{i}.attn.subln.weight"],
                                     cfg.n_heads), tensors[f"model.layers.{i}.self_attn.o_proj.weight"])
                   for i in range(cfg.n_layers))
    except (KeyError, RuntimeError):
        return False


__all__ = [
    "config_from_hf", "from_hf_model", "from_hf_state_dict", "hf_config", "hf_config_dict", "is_hf_folder",
    "load_hf", "read_hf_config", "save_hf", "sentencepiece_to_tokenizers", "to_hf_model", "to_hf_state_dict",
]
