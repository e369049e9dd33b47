"""Write a Llama-architecture model as a GGUF file llama.cpp loads: F32 / F16, or Q8_0 / Q4_0 block weights.

Two ways to block weights (see :mod:`diffquant.ggml_blocks`):

* a **float** model is rounded by llama.cpp's own block quantizer (``gguf.quants``, a port of
  ``quantize_row_q*_ref``): what llama.cpp's tools would make of the same weights;
* a **quantized** model (RTN / GPTQ, e.g. a packed checkpoint) has its integer codes and scales written as they
  are, where the format can hold them exactly; anything else is refused with the reason.

Either way the quantized set is ours: the Linear layers inside the blocks (``embeddings=True`` adds the
embedding and output head for float models). A block Linear whose rows do not split into blocks of 32
(stories260K's ffn_down, 172 columns) stays float, as in llama.cpp's converter (which uses F16 there), and norms
are always F32. Names and layout follow llama.cpp's convert_hf_to_gguf: q/k rows need no permutation because
our RoPE already rotates interleaved pairs like llama.cpp.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError
from .checkpoint.gguf import _GLOBAL_NAMES, _LAYER_NAMES
from .exports import block_int_weights, check_weight_only, dequantized_copy
from .ggml_blocks import BLOCK, BLOCK_TYPES, encode_blocks, llamacpp_quantize, representable_problem
from .io import atomic_path
from .model import LM
from .quant.api import is_quantized

log = logging.getLogger(__name__)

__all__ = ["GGUF_TYPES", "save_gguf"]

GGUF_TYPES = ("f32", "f16", "q8_0", "q4_0")
_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0"}
_TO_GGUF = {ours: theirs for theirs, ours in _LAYER_NAMES.items()}
_GLOBAL = {ours: theirs for theirs, ours in _GLOBAL_NAMES.items()}


def gguf_name(ours: str) -> str:
    """``layers.2.mlp.down_proj.weight`` -> ``blk.2.ffn_down.weight``; ``embed.weight`` -> ``token_embd.weight``."""
    if ours in _GLOBAL:
        return _GLOBAL[ours]
    _, index, rest = ours.split(".", 2)
    return f"blk.{index}.{_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def save_gguf(model: LM, path: str | Path, gguf_type: str = "f32", tokenizer=None, vocab_from: str | Path | None = None,
              embeddings: bool = False, overwrite: bool = False) -> dict:
    """Write ``model`` (a Transformer, float or RTN/GPTQ-quantized) to the .gguf file ``path`` atomically.

    ``tokenizer``: a SentencePiece diffquant ``Tokenizer`` whose vocabulary goes into the file; ``vocab_from``:
    a .gguf file whose ``tokenizer.*`` fields are copied instead. Returns a summary: tensor name -> type.
    """
    path = Path(path)
    if gguf_type not in GGUF_TYPES:
        raise CheckpointError(f"unknown GGUF type {gguf_type!r}; choose one of {', '.join(GGUF_TYPES)}")
    if model.config.arch != "transformer":
        raise CheckpointError(f"llama.cpp has no architecture for the {model.config.arch!r} arm; only Transformer "
                              "(Llama) models export to GGUF")
    if path.exists() and not overwrite:
        raise CheckpointError(f"{path} exists; pass overwrite=True to replace it")
    tensors = _tensors(model, gguf_type.upper(), embeddings)
    with atomic_path(path) as tmp:
        _write(tmp, model.config, tensors, gguf_type, tokenizer, vocab_from)
    types = {name: kind for name, (kind, _) in tensors.items()}
    log.info("saved %s (%s; %d block-quantized tensors)", path, gguf_type,
             sum(kind in BLOCK_TYPES for kind in types.values()))
    return types


def _tensors(model: LM, qtype: str, embeddings: bool) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (type, data): float32 / float16 arrays or raw block bytes."""
    quantized = is_quantized(model)
    ints = {}
    if quantized:
        check_weight_only(model, "GGUF")
        ints = block_int_weights(model)
        model = dequantized_copy(model)
    float_type = "F16" if qtype == "F16" else "F32"
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("head.weight")  # llama.cpp reuses token_embd
    out = {}
    for name, w in state.items():
        module = name.removesuffix(".weight")
        if w.ndim == 1:
            out[gguf_name(name)] = ("F32", w)  # llama.cpp keeps norms in F32
        elif qtype in BLOCK_TYPES and quantized and module in ints:
            out[gguf_name(name)] = (qtype, _ours_as_blocks(module, ints[module], qtype))
        elif qtype in BLOCK_TYPES and not quantized and _rounded_by_llamacpp(module, embeddings) \
                and w.shape[1] % BLOCK == 0:
            out[gguf_name(name)] = (qtype, llamacpp_quantize(w, qtype))
        else:
            if qtype in BLOCK_TYPES and w.shape[1] % BLOCK and (module in ints or not quantized):
                log.info("%s: %d columns do not split into blocks of %d; kept %s", name, w.shape[1], BLOCK, float_type)
            out[gguf_name(name)] = (float_type, w.astype(np.float16 if float_type == "F16" else np.float32))
    return out


def _rounded_by_llamacpp(module: str, embeddings: bool) -> bool:
    return module.startswith("layers.") or embeddings


def _ours_as_blocks(module: str, w, qtype: str) -> np.ndarray:
    signed, scale = w.signed().numpy(), w.scale.float().numpy()
    problem = representable_problem(signed, scale, w.group, qtype)
    if problem is not None:
        raise CheckpointError(f"{module} ({w.bits}-bit, group {w.group_size or 'per row'}) is not exactly "
                              f"representable as {qtype}: {problem}")
    return encode_blocks(signed, scale, w.group, qtype)


def _write(path: Path, cfg, tensors: dict, gguf_type: str, tokenizer, vocab_from) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("diffquant")
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType[_FILE_TYPES[gguf_type]])
    if gguf_type.upper() in BLOCK_TYPES:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, tokenizer, vocab_from)
    for name, (kind, data) in tensors.items():
        if kind in BLOCK_TYPES:
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_vocab(w, tokenizer, vocab_from) -> None:
    """The vocabulary llama.cpp tokenizes with, from a .gguf file or a tokenizer: llama-style for SentencePiece,
    gpt2-style for byte-level BPE (the project tokenizer)."""
    if vocab_from is not None:
        from .checkpoint.gguf import _open

        reader = _open(Path(vocab_from))
        for key, field in reader.fields.items():
            if key.startswith("tokenizer."):
                _copy_field(w, key, field)
        return
    if tokenizer is None:
        log.warning("no tokenizer given: llama.cpp cannot tokenize with this file")
        return
    if tokenizer.kind == "hf":
        from .gguf_vocab import add_bpe_vocab

        add_bpe_vocab(w, tokenizer)
        return
    sp = tokenizer.backend
    n = sp.get_piece_size()
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([_token_type(sp, i) for i in range(n)])
    for add, token in ((w.add_unk_token_id, sp.unk_id()), (w.add_bos_token_id, tokenizer.bos_id),
                       (w.add_eos_token_id, tokenizer.eos_id)):
        if token is not None and token >= 0:
            add(token)


def _token_type(sp, i: int) -> int:
    """llama.cpp's token types: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte."""
    for test, kind in ((sp.is_unknown, 2), (sp.is_control, 3), (sp.is_unused, 5), (sp.is_byte, 6)):
        if test(i):
            return kind
    return 1


def _copy_field(w, key: str, field) -> None:
    from gguf import GGUFValueType

    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        w.add_array(key, field.contents())
    else:
        w.add_key_value(key, field.contents(), kind)

