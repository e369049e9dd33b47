"""Profile one checkpoint as ``diffquant profile`` does: load it (natively, or dispatched over devices), tokenise
the data with its own tokenizer, cut windows of its training context and record the Table-5 statistics."""

from __future__ import annotations

from pathlib import Path

from . import distributed
from .checkpoint import WEIGHTS_FILE, read_metadata, training_context
from .data import documents, encode_documents
from .errors import UserError
from .hf_probes import load_for_profiling
from .offload import load_dispatched
from .profile import DEFAULT_SITES, profile, token_batches
from .records import checkpoint_label
from .tokenizer import Tokenizer, tokenizer_for

PAPER_TOKENS = 409_600  # the paper's 0.4M tokens


def profile_checkpoint(path: str, *, data: str = "test", tokens: int = PAPER_TOKENS, seq_len: int | None = None,
                       batch_size: int = 8, topk: int = 100, sites: tuple[str, ...] = DEFAULT_SITES,
                       protocol: str = "global", exact_median: bool = False, chunk: int | None = None,
                       tokenizer: str | Tokenizer | None = None, device: str = "cpu",
                       dispatch: dict | None = None) -> dict:
    """The profile record of the checkpoint at ``path`` on ``tokens`` tokens of ``data`` (a split, calib source or
    text file), naming its source, window length and training tokens. ``dispatch``: ``load_dispatched`` keyword
    arguments (accelerate places the layers); without it the model goes to ``device`` (under torch.distributed,
    this rank's device)."""
    model = load_dispatched(path, **dispatch) if dispatch else load_for_profiling(path)  # HF folders natively
    if distributed.is_distributed() and not dispatch:
        model.to(distributed.local_device())  # NCCL: this rank's GPU; gloo: the CPU
    elif not dispatch:
        model.to(device)
    tok = tokenizer_for(path, tokenizer)
    window, source = window_length(path, model.config.max_seq_len, seq_len)
    if window > model.config.max_seq_len:
        raise UserError(f"--seq-len {window} exceeds {path}'s max_seq_len {model.config.max_seq_len}")
    ids = encode_documents(tok, documents(data))
    batches = token_batches(ids, window, batch_size, tokens)
    report = profile(model, batches, sites=sites, topk=topk, protocol=protocol, exact_median=exact_median,
                     chunk=chunk, label=checkpoint_label(path))
    record = report.data
    record.update(checkpoint=str(path), data=str(data), seq_len=window, seq_len_source=source,
                  tokens_requested=tokens)
    meta = read_metadata(path) if (Path(path) / WEIGHTS_FILE).is_file() else {}
    record["train_tokens"] = int(meta["tokens"]) if "tokens" in meta else None
    return record


def window_length(path: str, max_seq_len: int, given: int | None) -> tuple[int, str]:
    """(window length, where it came from): ``given`` (--seq-len), else the training context where known (never
    beyond max_seq_len), else the model's max_seq_len."""
    if given:
        return given, "--seq-len"
    trained = training_context(path)
    if trained is not None and trained <= max_seq_len:
        return trained, "training context"
    return max_seq_len, "max_seq_len"
