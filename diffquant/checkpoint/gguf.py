"""Load a Llama-architecture GGUF file (F32 / F16; Q8_0 / Q4_0 dequantized) into an ``LM``, e.g. stories260K.

Read with the ``gguf`` package (transformers' GGUF loader fails on stories260K: "Padding_idx must be within
num_embeddings"). The config comes from the ``llama.*`` metadata and the tensor shapes; names map as in
:data:`_GLOBAL_NAMES` / :data:`_LAYER_NAMES`. No RoPE permutation is needed: llama.cpp's LLAMA rope rotates
interleaved pairs (x[2i], x[2i+1]) like our model (convert_hf_to_gguf permutes HF's rotate-half q/k weights
into that layout, llama2.c trains in it), which the greedy sample test confirms. Anything else (another
architecture, other quantized tensor types, rope scaling, partial rotary, biases, MoE) raises ``CheckpointError``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig
from ..data import calib_dir
from ..errors import first_line
from ..model import LM, build_model
from .files import CheckpointError, check_shapes
from .native import expected_shapes

log = logging.getLogger(__name__)

STORIES260K = "models/stories260K.gguf"  # under calib/
STORIES260K_TOKENIZER = "models/stories260K_tok512_from_gguf.model"  # SentencePiece, BOS 1, EOS 2

_GLOBAL_NAMES = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight",
                 "output.weight": "head.weight"}
_LAYER_NAMES = {
    "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj", "attn_output": "attn.out_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "attn_norm", "ffn_norm": "mlp_norm",
}
_FLOAT_TYPES = ("F32", "F16")
_BLOCK_TYPES = ("Q8_0", "Q4_0")  # dequantized on load by llama.cpp's numerics (ggml_blocks)


def stories260k_path() -> Path:
    """The shipped stories260K GGUF model (karpathy/tinyllamas, dim 64, 5 layers, vocab 512)."""
    return calib_dir() / STORIES260K


def stories260k_tokenizer_path() -> Path:
    """The SentencePiece model of stories260K's vocabulary; load it with ``Tokenizer.load``."""
    return calib_dir() / STORIES260K_TOKENIZER


def load_gguf(path: str | Path) -> LM:
    """A float32 model in eval mode holding the weights of the Llama GGUF file ``path``."""
    path = Path(path)
    reader, shapes, cfg = _read_header(path)
    check_shapes(path, expected_shapes(cfg), {_our_name(path, name): s for name, s in shapes.items()})
    state = {_our_name(path, name): t for name, t in _tensors(path, reader).items()}
    model = build_model(cfg)
    model.load_state_dict(state, strict=False)  # strict=False only for the tied head, checked above
    log.info("loaded %s: %s", path, cfg)
    return model.eval()


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The model config of a GGUF file, from its metadata and tensor shapes only (no tensor is read)."""
    return _read_header(Path(path))[2]


def _read_header(path: Path):
    reader = _open(path)
    meta = _metadata(reader)
    _refuse_unsupported(path, meta)
    shapes = {t.name: torch.Size(int(n) for n in reversed(t.shape)) for t in reader.tensors}  # (out, in)
    return reader, shapes, _config(path, meta, shapes)


def read_vocab(path: str | Path) -> list[str]:
    """The token strings stored in the file (``tokenizer.ggml.tokens``)."""
    field = _open(Path(path)).fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise CheckpointError(f"{path} stores no vocabulary (tokenizer.ggml.tokens)")
    return field.contents()


# -- reading ----------------------------------------------------------------------------------------------

def _open(path: Path):
    from gguf import GGUFReader  # imported lazily: only GGUF users need the gguf package

    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist")
    try:
        return GGUFReader(str(path), "r")
    except Exception as exc:  # the reader fails with assorted types (ValueError, IndexError, struct/numpy errors)
        raise CheckpointError(f"{path} is not a GGUF file or is corrupt or truncated ({first_line(exc)})") from None


def _metadata(reader) -> dict:
    """Scalar and string metadata (arrays such as the vocabulary are skipped)."""
    from gguf import GGUFValueType

    return {name: field.contents() for name, field in reader.fields.items()
            if field.types and field.types[0] != GGUFValueType.ARRAY}


def _tensors(path: Path, reader) -> dict[str, torch.Tensor]:
    out = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in _FLOAT_TYPES + _BLOCK_TYPES:
            raise CheckpointError(f"{path}: tensor {t.name} is {kind}; only F32, F16, Q8_0 and Q4_0 tensors are "
                                  "supported")
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first: reverse to (out, in)
        data = np.asarray(t.data)
        if kind in _BLOCK_TYPES:
            from ..ggml_blocks import dequantize

            data = dequantize(data, kind)
        if data.size != int(np.prod(shape)):
            raise CheckpointError(f"{path}: tensor {t.name} holds {data.size} values, not the {shape} it declares")
        tensor = torch.from_numpy(data.reshape(shape).astype(np.float32))  # a copy: the file stays closed
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{path}: tensor {t.name} contains NaN or Inf")
        out[t.name] = tensor
    return out


def _our_name(path: Path, name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES \
            and parts[3] == "weight":
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    raise CheckpointError(f"{path}: unsupported tensor {name} (only plain Llama weights are supported)")


# -- the config -------------------------------------------------------------------------------------------

def _config(path: Path, meta: dict, shapes: dict[str, torch.Size]) -> ModelConfig:
    def need(key: str):
        if f"llama.{key}" not in meta:
            raise CheckpointError(f"{path}: metadata llama.{key} is missing")
        return meta[f"llama.{key}"]

    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight"):
        if name not in shapes:
            raise CheckpointError(f"{path}: tensor {name} is missing")
    d_model, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
    if n_heads < 1:
        raise CheckpointError(f"{path}: metadata llama.attention.head_count must be positive, got {n_heads}")
    n_kv = int(meta.get("llama.attention.head_count_kv", n_heads))
    q_dim = shapes["blk.0.attn_q.weight"][0]
    if q_dim % n_heads:
        raise CheckpointError(f"{path}: attn_q width {q_dim} is not a multiple of {n_heads} heads")
    head_dim = q_dim // n_heads
    rotary = int(meta.get("llama.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise CheckpointError(f"{path}: partial rotary embeddings ({rotary} of {head_dim} dims) are not supported")
    try:
        return ModelConfig(
            arch="transformer", vocab_size=shapes["token_embd.weight"][0], d_model=d_model,
            n_layers=int(need("block_count")), n_heads=n_heads, n_kv_heads=n_kv,
            head_dim=head_dim,
            ffn_dim=int(need("feed_forward_length")), max_seq_len=int(need("context_length")),
            rope_theta=_decimal(meta.get("llama.rope.freq_base", 10000.0)),
            norm_eps=_decimal(need("attention.layer_norm_rms_epsilon")),
            tie_embeddings="output.weight" not in shapes,
        )
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: invalid model metadata ({first_line(exc)})") from None


def _decimal(value) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _refuse_unsupported(path: Path, meta: dict) -> None:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    scaling = meta.get("llama.rope.scaling.type", "none")
    factor = float(meta.get("llama.rope.scaling.factor", 1.0))
    if scaling != "none" or factor not in (0.0, 1.0):
        raise CheckpointError(f"{path}: rope scaling ({scaling}, factor {factor}) is not supported")
    if int(meta.get("llama.expert_count", 0)) > 0:
        raise CheckpointError(f"{path}: mixture-of-experts models are not supported")
