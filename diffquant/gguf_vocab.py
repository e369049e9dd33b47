"""Vocabularies embedded in GGUF files: read in both of llama.cpp's common styles, written in either.

* ``llama`` (SentencePiece): ``tokenizer.ggml.tokens`` / ``scores`` / ``token_type``. Read back as a real
  SentencePiece model, its ModelProto written here field by field (the ``protobuf`` package is not needed), so
  encoding is SentencePiece's own: a BPE model with byte fallback and llama's identity normaliser with a dummy
  prefix (``tokenizer.ggml.add_space_prefix``, default true) — what llama.cpp's ``llm_tokenizer_spm`` does.
* ``gpt2`` (byte-level BPE): ``tokens`` / ``token_type`` / ``merges``, as llama.cpp's convert_hf_to_gguf writes
  for GPT-2-style tokenizers; read as a ``tokenizers`` BPE with GPT-2's byte-level pre-tokenizer, the project
  tokenizer's recipe (:mod:`diffquant.tokenizer`), and written so from it.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

from .errors import UserError

log = logging.getLogger(__name__)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's and SentencePiece's types
_SPM_BPE = 2  # TrainerSpec.ModelType.BPE


def embedded_vocabulary(path: str | Path) -> tuple | None:
    """The tokenizer stored in a GGUF file's ``tokenizer.*`` fields as ``(backend, kind, bos_id, eos_id)``, the
    arguments of :class:`~diffquant.tokenizer.Tokenizer` (which wraps it); None when it stores none."""
    from .checkpoint.gguf import _open

    path = Path(path)
    fields = {k: f.contents() for k, f in _open(path).fields.items() if k.startswith("tokenizer.")}
    style = fields.get("tokenizer.ggml.model")
    if style is None or "tokenizer.ggml.tokens" not in fields:
        return None
    if style == "llama":
        return _sentencepiece(fields, path)
    if style == "gpt2":
        return _byte_level_bpe(fields, path)
    raise UserError(f"{path}: its {style!r} vocabulary is not one diffquant reads (llama, gpt2); name a tokenizer "
                    "with --tokenizer FILE")


def _same_lengths(path: Path, *lists) -> None:
    if len({len(x) for x in lists}) > 1:
        raise UserError(f"{path}: its vocabulary's token, score and type lists differ in length (a corrupt file)")


def _special(fields: dict, name: str) -> int | None:
    value = fields.get(f"tokenizer.ggml.{name}_token_id")
    return int(value) if value is not None else None


# -- llama / SentencePiece ------------------------------------------------------------------------------------

def _sentencepiece(fields: dict, path: Path) -> tuple:
    import sentencepiece as spm

    tokens = fields["tokenizer.ggml.tokens"]
    scores = fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    ids = {name: _special(fields, name) for name in ("unknown", "bos", "eos", "padding")}
    _same_lengths(path, tokens, scores, types)
    proto = sentencepiece_proto(tokens, scores, types, ids, fields.get("tokenizer.ggml.add_space_prefix", True))
    try:
        sp = spm.SentencePieceProcessor(model_proto=proto)
    except Exception as exc:  # sentencepiece raises RuntimeError / OSError on a bad model
        raise UserError(f"{path}: its embedded llama vocabulary does not load ({exc})") from None
    return sp, "sentencepiece", ids["bos"], ids["eos"]


def sentencepiece_proto(tokens, scores, types, ids: dict, add_dummy_prefix: bool = True) -> bytes:
    """A serialized SentencePiece ``ModelProto``: pieces (field 1), trainer spec (2), normaliser spec (3)."""
    pieces = b"".join(_message(1, _string(1, t) + _float(2, s) + _varint_field(3, int(k)))
                      for t, s, k in zip(tokens, scores, types, strict=True))
    unk = ids.get("unknown")
    trainer = (_varint_field(3, _SPM_BPE) + _varint_field(35, 1)  # model_type BPE, byte_fallback
               + _varint_field(40, 0 if unk is None else unk)
               + b"".join(_varint_field(field, -1 if ids.get(name) is None else ids[name])
                          for field, name in ((41, "bos"), (42, "eos"), (43, "padding"))))
    normalizer = (_string(1, "identity") + _varint_field(3, int(bool(add_dummy_prefix)))
                  + _varint_field(4, 0) + _varint_field(5, 1))  # keep extra spaces, escape them as ▁
    return pieces + _message(2, trainer) + _message(3, normalizer)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative ints are ten-byte two's complement varints
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varint_field(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _message(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _string(field: int, text: str) -> bytes:
    return _message(field, text.encode("utf-8"))


def _float(field: int, value: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", float(value))


# -- gpt2 / byte-level BPE ------------------------------------------------------------------------------------

def _byte_level_bpe(fields: dict, path: Path) -> tuple:
    import tokenizers as tk

    tokens = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
    types = fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    _same_lengths(path, tokens, types)
    tok = tk.Tokenizer(tk.models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's split
    tok.decoder = tk.decoders.ByteLevel()
    tok.add_special_tokens([t for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    return tok, "hf", _special(fields, "bos"), _special(fields, "eos")


def add_bpe_vocab(writer, tokenizer) -> None:
    """Store a byte-level BPE ``tokenizer`` (the project's recipe) gpt2-style, as llama.cpp's converter does."""
    backend = tokenizer.backend
    model = json.loads(backend.to_str())["model"]
    if model.get("type") != "BPE":
        raise UserError(f"tokenizer {tokenizer.path}: a {model.get('type')} model has no GGUF gpt2 form")
    n = backend.get_vocab_size(with_added_tokens=True)
    tokens = [backend.id_to_token(i) for i in range(n)]
    special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if t in special else NORMAL for t in tokens])
    writer.add_token_merges(merges)
    for add, token in ((writer.add_bos_token_id, tokenizer.bos_id), (writer.add_eos_token_id, tokenizer.eos_id)):
        if token is not None:
            add(token)
    writer.add_add_bos_token(tokenizer.bos_id is not None)  # our models are trained with BOS before each text
