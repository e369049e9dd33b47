"""Calibration data for GPTQ: how much, and the one rule for which windows (quantize command, sweep, lm-eval).

The rule: ``ceil(n_tokens / seq_len)`` windows of ``seq_len`` tokens, starting at offsets drawn uniformly from
``0 .. len - seq_len`` (inclusive: the last window may end at the last token) by ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .data import documents, encode_documents
from .errors import UserError
from .tokenizer import Tokenizer, tokenizer_for

DEFAULT_CALIB_TOKENS = 32768  # the quantize command's, the sweep's and lm-eval's default
DEFAULT_SEQ_LEN = 256  # the quantize command's window length (capped at the model's context)


def calibration_batch(tokenizer, seq_len: int, n_tokens: int, seed: int = 0, data: str = "train") -> torch.Tensor:
    """``ceil(n_tokens / seq_len)`` windows of ``seq_len`` tokens at seeded random offsets of ``data``: the train
    split (cached tokens) or any documents() spec encoded with ``tokenizer``."""
    return calibration_windows(calibration_tokens(tokenizer, data)[0], seq_len, n_tokens, seed, data)


def calibration_windows(ids: np.ndarray, seq_len: int, n_tokens: int, seed: int = 0,
                        data: str = "calibration data") -> torch.Tensor:
    """The rule of this module on the token ids ``ids``: a LongTensor [ceil(n_tokens / seq_len), seq_len]."""
    if ids.size <= seq_len:
        raise ValueError(f"{data!r} has {ids.size} tokens, not enough for a {seq_len}-token window")
    rows = math.ceil(n_tokens / seq_len)
    starts = np.random.default_rng(seed).integers(0, ids.size - seq_len + 1, size=rows)
    return torch.from_numpy(np.stack([ids[s:s + seq_len] for s in starts]).astype(np.int64))  # (N, T)


def calibration_tokens(tokenizer, data: str = "train") -> tuple[np.ndarray, dict]:
    """Token ids of ``data`` with ``tokenizer`` and what they are (the train split's are cached on disk)."""
    if data == "train" and tokenizer.path is not None:
        from .train import split_tokens  # cached, keyed by the text's and the tokenizer file's sha256

        return split_tokens("train", tokenizer=tokenizer)
    return encode_documents(tokenizer, documents(data)), {"data": data}


def gptq_calibration(checkpoint, model, n_tokens: int = DEFAULT_CALIB_TOKENS, seq_len: int | None = None,
                     seed: int = 0, tokenizer_path=None) -> tuple[torch.Tensor, dict, Tokenizer]:
    """Windows of the calib train split for a checkpoint's GPTQ, tokenised with its tokenizer (or
    ``tokenizer_path``); returns (windows [N, T], what they are, the tokenizer)."""
    tokenizer = tokenizer_for(checkpoint, tokenizer_path)  # refuses one that does not fit the model
    context = model.config.max_seq_len
    seq_len = seq_len or min(DEFAULT_SEQ_LEN, context)
    if not 1 <= seq_len <= context:
        raise UserError(f"--calib-seq-len must lie in 1..{context}")
    if n_tokens < seq_len:
        raise UserError(f"--calib-tokens must be at least one window ({seq_len} tokens)")
    ids, info = calibration_tokens(tokenizer, "train")
    try:
        windows = calibration_windows(ids, seq_len, n_tokens, seed, "the calibration split")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return windows, {**info, "windows": len(windows), "seq_len": seq_len, "seed": seed,
                     "tokenizer": tokenizer.path}, tokenizer
