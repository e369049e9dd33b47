"""A thin tokenizer wrapper (HF ``tokenizer.json`` or SentencePiece ``.model``) and the project's BPE recipe.

The shipped ``calib/tokenizer.json`` is byte-level BPE trained by :func:`train_tokenizer` on the train split
(``experiments/train_tokenizer.py``). The recipe, fixed here so a retrain reproduces the file byte for byte:

* model: BPE, no unknown token (byte level covers every input), no dropout;
* normaliser: none (so decode(encode(text)) == text for any unicode text);
* pre-tokenizer: ByteLevel(add_prefix_space=False, use_regex=True), i.e. GPT-2's split regex over bytes;
* decoder: ByteLevel; no post-processor (BOS is added by :meth:`Tokenizer.encode` on request);
* special tokens: ``<|endoftext|>`` only, id 0, used as BOS, EOS and document separator;
* trainer: BpeTrainer(vocab_size=8192, min_frequency=2, initial_alphabet = the 256 ByteLevel symbols,
  limit_alphabet=None, max_token_length=None, show_progress=False);
* input: the train split's documents, one string each, in ``load_split("train")`` order;
* single-threaded (TOKENIZERS_PARALLELISM=false while training), saved with ``save(path, pretty=True)``.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .checkpoint.files import SENTENCEPIECE_FILE, TOKENIZER_FILE
from .errors import UserError, first_line

if TYPE_CHECKING:
    from .data import Document

log = logging.getLogger(__name__)

SPECIAL_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 8192
MIN_FREQUENCY = 2
TOKENIZER_FILES = (TOKENIZER_FILE, SENTENCEPIECE_FILE)  # what a checkpoint folder may ship, in lookup order


def tokenizer_file_name(tokenizer: "Tokenizer") -> str:
    """The name a tokenizer's file takes in a checkpoint folder or corpus."""
    return SENTENCEPIECE_FILE if tokenizer.kind == "sentencepiece" else TOKENIZER_FILE


class Tokenizer:
    """Same interface over an HF ``tokenizers.Tokenizer`` and a ``sentencepiece.SentencePieceProcessor``."""

    def __init__(self, backend, kind: str, bos_id: int | None, eos_id: int | None, path: str | None = None):
        self.backend = backend
        self.kind = kind  # "hf" | "sentencepiece"
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """An HF ``tokenizer.json`` or a SentencePiece ``.model`` file (chosen by content, then suffix)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer not found: {path}")
        try:
            if path.suffix == ".json" or path.read_bytes()[:1] == b"{":
                return cls.from_hf(_hf().Tokenizer.from_file(str(path)), str(path))
            import sentencepiece as spm

            sp = spm.SentencePieceProcessor(model_file=str(path))
        except Exception as exc:  # tokenizers and sentencepiece raise bare Exception / RuntimeError / OSError
            raise UserError(f"tokenizer {path} is corrupt or not a tokenizer ({first_line(exc)})") from None
        return cls(sp, "sentencepiece", _nonneg(sp.bos_id()), _nonneg(sp.eos_id()), str(path))

    @classmethod
    def from_hf(cls, tok, path: str | None = None) -> Tokenizer:
        """Wrap an in-memory ``tokenizers.Tokenizer``; BOS = EOS = ``<|endoftext|>`` when present."""
        bos = tok.token_to_id(SPECIAL_TOKEN)
        if bos is None:  # a foreign Llama-style tokenizer.json
            bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
        else:
            eos = bos
        return cls(tok, "hf", bos, eos, path)

    @property
    def vocab_size(self) -> int:
        if self.kind == "hf":
            return self.backend.get_vocab_size(with_added_tokens=True)
        return self.backend.get_piece_size()

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = self._encode_one(text)
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, no BOS; the HF backend runs this on its thread pool (RAYON_NUM_THREADS)."""
        if self.kind == "hf":
            return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]
        return self.backend.encode(list(texts))

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "hf":
            return self.backend.decode(ids, skip_special_tokens=skip_special)
        return self.backend.decode(ids)  # SentencePiece always drops control tokens

    def _encode_one(self, text: str) -> list[int]:
        if self.kind == "hf":
            return self.backend.encode(text, add_special_tokens=False).ids
        return self.backend.encode(text)

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, vocab={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id}, {self.path})"


def _nonneg(i: int) -> int | None:
    return i if i >= 0 else None


def _hf():
    import tokenizers

    return tokenizers


def default_tokenizer_path() -> Path:
    from diffquant.data import calib_dir

    return calib_dir() / TOKENIZER_FILE


def tokenizer_for(checkpoint: str | os.PathLike, tokenizer: str | os.PathLike | Tokenizer | None = None) -> Tokenizer:
    """The tokenizer that scores, profiles or calibrates a model; the one place that decides it.

    * ``tokenizer`` when given (every command's ``--tokenizer``): a Tokenizer, a tokenizer file, or a folder
      holding one;
    * else the checkpoint's own: ``tokenizer.json`` / ``tokenizer.model`` in its folder; for ``x.gguf`` a
      SentencePiece ``x*.model`` beside it, else the vocabulary embedded in the file;
    * else, for our own folders (native or packed), the project tokenizer, if its vocabulary is the model's.

    Refused in one line: an HF folder or GGUF file that carries no tokenizer (the project tokenizer would
    score it silently wrong), and any tokenizer with more tokens than the model has embedding rows."""
    path = Path(checkpoint)
    tok = _given_tokenizer(tokenizer) if tokenizer is not None else _own_tokenizer(path)
    vocab = model_vocab_size(path)
    if tok.vocab_size > vocab:
        raise UserError(f"tokenizer {tok.path or 'given'} has {tok.vocab_size} tokens but {path} has only {vocab} "
                        "embedding rows; pass the model's own tokenizer with --tokenizer")
    return tok


def _given_tokenizer(tokenizer: str | os.PathLike | Tokenizer) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    path = Path(tokenizer)
    if path.is_dir():
        found = [path / name for name in TOKENIZER_FILES if (path / name).is_file()]
        if not found:
            raise UserError(f"--tokenizer {path}: the folder holds no {' or '.join(TOKENIZER_FILES)}")
        path = found[0]
    if not path.is_file():
        raise UserError(f"--tokenizer {path} does not exist")
    return Tokenizer.load(path)


def _own_tokenizer(path: Path) -> Tokenizer:
    """The checkpoint's own tokenizer (see :func:`tokenizer_for`), or a one-line refusal."""
    from .checkpoint import checkpoint_format

    fmt = checkpoint_format(path)  # refuses a missing path, a pickle, an unknown file
    if path.is_dir():
        for name in TOKENIZER_FILES:
            if (path / name).is_file():
                return Tokenizer.load(path / name)
    if fmt == "gguf":
        return _gguf_tokenizer(path)
    if fmt in ("hf", "compressed"):
        raise UserError(f"{path} is an HF folder without {' or '.join(TOKENIZER_FILES)}: name its tokenizer with "
                        "--tokenizer FILE (the project tokenizer would score it wrongly)")
    project = default_tokenizer()
    if project.vocab_size != model_vocab_size(path):
        raise UserError(f"{path} ships no tokenizer and the project tokenizer ({project.vocab_size} tokens) does not "
                        f"fit its vocabulary ({model_vocab_size(path)}): name its tokenizer with --tokenizer FILE")
    return project


def _gguf_tokenizer(path: Path) -> Tokenizer:
    found = sorted(path.parent.glob(f"{path.stem}*.model"))
    if found:
        return Tokenizer.load(found[0])
    tok = embedded_tokenizer(path)
    if tok is None:
        raise UserError(f"{path} embeds no vocabulary and no SentencePiece {path.stem}*.model lies beside it: "
                        "name its tokenizer with --tokenizer FILE")
    return tok


def embedded_tokenizer(path: str | os.PathLike) -> Tokenizer | None:
    """The vocabulary embedded in a GGUF file (llama or gpt2 style) as a Tokenizer; None when it has none."""
    from .gguf_vocab import embedded_vocabulary

    found = embedded_vocabulary(path)
    return None if found is None else Tokenizer(*found, path=str(path))


def model_vocab_size(checkpoint: str | os.PathLike) -> int:
    """Embedding rows of a checkpoint, read from its config (any format; HF folders of any model type)."""
    from .checkpoint import checkpoint_format, read_model_config
    from .checkpoint.files import CONFIG_FILE, read_json

    path = Path(checkpoint)
    if checkpoint_format(path) == "hf":
        config = read_json(path / CONFIG_FILE)
        vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
        if isinstance(vocab, int) and vocab > 0:
            return vocab
    return read_model_config(path).vocab_size


def default_tokenizer() -> Tokenizer:
    """The project tokenizer shipped as ``calib/tokenizer.json``."""
    return Tokenizer.load(default_tokenizer_path())


@contextmanager
def _single_threaded():
    """tokenizers reads TOKENIZERS_PARALLELISM at each call: one thread keeps training reproducible."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def bpe_skeleton():
    """An untrained tokenizer with the project's model, pre-tokenizer and decoder (see module docstring)."""
    tk = _hf()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
                    min_frequency: int = MIN_FREQUENCY):
    """Train byte-level BPE on ``texts`` (in the given order) with the recorded recipe.

    Returns a ``tokenizers.Tokenizer``; save it with ``tok.save(path, pretty=True)``.
    """
    tk = _hf()
    tok = bpe_skeleton()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[SPECIAL_TOKEN],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    with _single_threaded():
        tok.train_from_iterator(texts, trainer=trainer)
    log.info("trained byte-level BPE: %d tokens", tok.get_vocab_size(with_added_tokens=True))
    return tok


def text_batches(texts: str | Sequence[str] | Sequence[Document], tokenizer, seq_len: int, batch_size: int = 8,
                 max_tokens: int | None = None, bos: bool = True) -> list:
    """Token batches (LongTensors ``[B, seq_len]``) from text, ready for ``profile``, ``quantize``'s calibration
    or a forward: each text (or Document, e.g. from :func:`documents`) tokenised with BOS before it (the training
    format, :func:`encode_documents`), the ids concatenated and cut into whole, non-overlapping windows of
    ``seq_len`` (the first ``max_tokens`` tokens at most), ``batch_size`` windows per batch.
    ``tokenizer``: a Tokenizer or a checkpoint path (its own tokenizer)."""
    import numpy as np
    import torch

    from .data import Document, encode_documents

    if isinstance(texts, str):
        texts = [texts]
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = tokenizer_for(tokenizer)
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("max_tokens", max_tokens or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    docs = [t if isinstance(t, Document) else Document(f"text{i}", t) for i, t in enumerate(texts)]
    ids = encode_documents(tokenizer, docs, bos=bos)
    ids = torch.from_numpy(ids[:max_tokens].astype(np.int64))
    n = len(ids) // seq_len
    if n == 0:
        raise ValueError(f"the text gives {len(ids)} tokens, fewer than one window of {seq_len}")
    return list(ids[: n * seq_len].view(n, seq_len).split(batch_size))  # (n, seq_len) -> batches [B, seq_len]
