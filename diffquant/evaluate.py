"""Evaluation: rolling perplexity, zero-shot multiple-choice scoring (paired statistics: :mod:`diffquant.paired`).

Everything follows lm-evaluation-harness (v0.4) so numbers are comparable:

* **Log-likelihood requests** ``(context, continuation)`` are tokenised as lm-eval's ``_encode_pair``: trailing
  whitespace of the context moves to the continuation, ``whole = enc(context + continuation)``,
  ``ctx = enc(context)``, continuation tokens = ``whole[len(ctx):]``. The model reads
  ``(ctx + cont)[-(max_len + 1):][:-1]`` (left truncation) and the continuation is scored on the last
  ``len(cont)`` positions (a continuation longer than ``max_len`` in pieces of ``max_len``). With ``bos=True``
  (default) the context starts with the tokenizer's BOS id: the project's models are trained with BOS before
  every document (lm-eval's HF default adds none; with ``bos=False`` an empty context still gets it, as lm-eval).
* **Multiple choice**: ``acc`` = argmax of the summed log-likelihood, ``acc_norm`` = argmax of the
  log-likelihood divided by the choice's length in characters (lm-eval ``completion_len``).
* **LAMBADA**: ``acc`` = every continuation token is the greedy argmax (lm-eval ``is_greedy``);
  ``perplexity`` = ``exp(-mean over items of the continuation's summed log-likelihood)`` (lm-eval's metric).
* **Rolling perplexity**: lm-eval's ``loglikelihood_rolling`` windows (:func:`get_rolling_token_windows`,
  :func:`make_disjoint_window`). The first window reads the prefix (BOS) and up to ``max_len - 1`` tokens and
  scores up to ``max_len``; every later window reads exactly ``max_len`` tokens and scores the next ``stride``
  of them, so every token is scored exactly once and each later window has at least ``max_len - stride``
  tokens of context before its first scored token. ``stride=None`` means ``stride = max_len``, lm-eval's own
  setting (``context_len=1``): disjoint blocks, as lm-eval scores WikiText.

Models: anything whose ``forward(input_ids [B, T])`` returns logits ``[B, T, V]`` (or an object with
``.logits``, as HF models) and whose config has ``max_seq_len`` (or ``max_position_embeddings``). Tokenizers:
:class:`diffquant.tokenizer.Tokenizer` (``encode(text)`` without specials, ``bos_id``) or a transformers
tokenizer (``encode(text, add_special_tokens=False)``, ``bos_token_id``). Results are JSON-serialisable dicts
with per-item / per-window records for the paired statistics of :mod:`diffquant.paired`.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from . import distributed
from .dispatch import input_device
from .eta import FirstBatchEstimate
from .io import finite_or_none
from .probes import real_lengths
from .progress import progress_bar
from .tasks import TASKS, Item, canonical_task, limit_ids, load_task

log = logging.getLogger(__name__)

Request = tuple[list[int], list[int]]  # (context tokens, continuation tokens)


# ---------------------------------------------------------------------------------------------------- models

def model_max_len(model) -> int:
    """The longest input the model takes: ``config.max_seq_len`` (diffquant) or ``max_position_embeddings``."""
    cfg = getattr(model, "config", None)
    for attr in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError("cannot tell the model's maximum sequence length: pass max_len")


def _device(model) -> torch.device:
    return input_device(model)  # the CPU for a model whose first weights are offloaded (device_map)


def _logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    out = model(input_ids)
    return out.logits if hasattr(out, "logits") else out


@contextmanager
def _eval_mode(model):
    """Eval mode for the duration, the caller's train/eval state restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------------- scoring

def score_requests(model, requests: Sequence[Request], batch_size: int = 8, max_len: int | None = None,
                   progress: bool = True, desc: str = "scoring") -> list[dict]:
    """Sum log-likelihood (nats) of each continuation given its context, batched with right padding.

    Returns one ``{"ll", "greedy", "tokens"}`` per request, in order. The model reads
    ``(ctx + cont)[-(max_len + 1):][:-1]``; a continuation longer than ``max_len`` is scored in consecutive
    pieces of ``max_len`` tokens, each after everything before it (left-truncated), and the pieces summed.
    Rows run longest first (as lm-eval) so a batch wastes little padding; a causal model never sees the
    padding of shorter rows, nor do the scales of dynamic activation quantizers (:func:`real_lengths`), so a
    request scores the same in any batch.
    """
    max_len = max_len or model_max_len(model)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    pieces, owners = _split_long(requests, max_len)
    inputs = [(ctx + cont)[-(max_len + 1):][:-1] for ctx, cont in pieces]
    order = sorted(range(len(pieces)), key=lambda i: -len(inputs[i]))
    # The batches are cut as in one process and dealt out whole (a row's logits may depend on its batch's
    # shape in the last bits), so a data-parallel run scores every piece exactly as a single process does.
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    device = _device(model)
    progress = progress and distributed.is_main()

    def score_mine() -> dict[int, dict]:
        mine, my_batches = {}, [batches[j] for j in distributed.strided(len(batches))]
        estimate = FirstBatchEstimate(desc, sum(len(inputs[i]) for rows in my_batches for i in rows),
                                      enabled=progress)
        with _eval_mode(model), progress_bar(total=len(order), desc=desc, disable=not progress, leave=False) as bar:
            for rows in my_batches:
                lengths = [len(inputs[i]) for i in rows]
                with real_lengths(lengths):
                    logits = _logits(model, _pad([inputs[i] for i in rows], device))
                for r, i in enumerate(rows):
                    mine[i] = _continuation_score(logits[r], len(inputs[i]), pieces[i][1])
                estimate.batch_done(sum(lengths))
                bar.update(len(rows) * distributed.world_size())
        return mine

    shares = distributed.reduce_on_main(score_mine, lambda parts: {i: s for part in parts for i, s in part.items()})
    return _merge_pieces([shares[i] for i in range(len(pieces))], owners, len(requests))


def _split_long(requests: Sequence[Request], max_len: int) -> tuple[list[Request], list[int]]:
    """Requests as pieces whose continuation fits ``max_len``, with the index of the request each came from."""
    pieces, owners = [], []
    for k, (ctx, cont) in enumerate(requests):
        ctx, cont = list(ctx), list(cont)
        if not ctx:
            raise ValueError("a request needs at least one context token (BOS or a prefix token)")
        if not cont:
            raise ValueError("a request needs at least one continuation token")
        for s in range(0, len(cont), max_len):
            pieces.append((ctx + cont[:s], cont[s:s + max_len]))
            owners.append(k)
    return pieces, owners


def _merge_pieces(scores: list, owners: list[int], n: int) -> list[dict]:
    out = [{"ll": 0.0, "greedy": True, "tokens": 0} for _ in range(n)]
    for k, s in zip(owners, scores, strict=True):
        out[k] = {"ll": out[k]["ll"] + s["ll"], "greedy": out[k]["greedy"] and s["greedy"],
                  "tokens": out[k]["tokens"] + s["tokens"]}
    return out


def _pad(rows: list[list[int]], device) -> torch.Tensor:
    out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)


def _continuation_score(logits: torch.Tensor, n_input: int, cont: Sequence[int]) -> dict:
    """logits (T, V) of one row: the last len(cont) input positions predict the continuation."""
    k = len(cont)
    wide = torch.promote_types(logits.dtype, torch.float32)
    logp = F.log_softmax(logits[n_input - k:n_input].to(wide), dim=-1)  # (k, V)
    target = torch.tensor(list(cont), device=logits.device)
    ll = logp.gather(-1, target[:, None]).to(torch.float64).sum()
    greedy = bool((logp.argmax(-1) == target).all())
    return {"ll": float(ll), "greedy": greedy, "tokens": k}


# ---------------------------------------------------------------------------------------------------- tokenising

def _encode(tokenizer, text: str) -> list[int]:
    if hasattr(tokenizer, "bos_token_id"):  # a transformers tokenizer: no special tokens here
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))


def _prefix_id(tokenizer) -> int | None:
    """BOS, else EOS (lm-eval's prefix token), else None."""
    for attr in ("bos_id", "bos_token_id", "eos_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return None


def encode_pair(tokenizer, context: str, continuation: str, bos: bool = True) -> Request:
    """Context and continuation tokens as lm-eval's ``_encode_pair`` (see the module docstring)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    ctx = _encode(tokenizer, context)
    cont = _encode(tokenizer, context + continuation)[len(ctx):]
    prefix = _prefix_id(tokenizer)
    if (bos or not ctx) and prefix is not None:
        ctx = [prefix, *ctx]
    return ctx, cont


# ---------------------------------------------------------------------------------------------------- tasks

def score_multiple_choice(model, tokenizer, items: Sequence[Item], batch_size: int = 8, bos: bool = True,
                          progress: bool = True) -> dict:
    """``acc`` and ``acc_norm`` over ``items`` with per-item records for pairing.

    Each record: ``id, gold, predicted, predicted_norm, correct, correct_norm, ll`` (the summed
    log-likelihood of every choice, in nats).
    """
    _check_items(items)
    requests, owners = [], []
    for k, item in enumerate(items):
        for context, continuation in item.requests():
            requests.append(encode_pair(tokenizer, context, continuation, bos))
            owners.append(k)
    scores = score_requests(model, requests, batch_size, progress=progress, desc=items[0].task)
    lls: list[list[float]] = [[] for _ in items]
    for k, s in zip(owners, scores, strict=True):
        lls[k].append(s["ll"])
    records = [_mc_record(item, ll) for item, ll in zip(items, lls, strict=True)]
    return {"n": len(records), "acc": _mean(r["correct"] for r in records),
            "acc_norm": _mean(r["correct_norm"] for r in records), "items": records}


def _mc_record(item: Item, ll: list[float]) -> dict:
    lengths = np.array([max(1, len(c)) for c in item.choices], dtype=np.float64)
    pred = int(np.argmax(ll))
    pred_norm = int(np.argmax(np.array(ll) / lengths))
    return {"id": item.id, "gold": item.gold, "predicted": pred, "predicted_norm": pred_norm,
            "correct": pred == item.gold, "correct_norm": pred_norm == item.gold, "ll": ll}


def score_lambada(model, tokenizer, items: Sequence[Item], batch_size: int = 8, bos: bool = True,
                  progress: bool = True) -> dict:
    """LAMBADA: ``acc`` (the last word is the greedy continuation) and lm-eval's ``perplexity``.

    Each record: ``id, gold (0), correct, ll, tokens``.
    """
    _check_items(items)
    requests = [encode_pair(tokenizer, *item.requests()[0], bos) for item in items]
    scores = score_requests(model, requests, batch_size, progress=progress, desc=items[0].task)
    records = [{"id": item.id, "gold": 0, "correct": s["greedy"], "ll": s["ll"], "tokens": s["tokens"]}
               for item, s in zip(items, scores, strict=True)]
    mean_ll = _mean(r["ll"] for r in records)
    return {"n": len(records), "acc": _mean(r["correct"] for r in records), "perplexity": math.exp(-mean_ll),
            "items": records}


def evaluate_task(model, tokenizer, task: str, limit: int | None = None, seed: int = 0, batch_size: int = 8,
                  bos: bool = True, progress: bool = True, path=None, subset: str = "first") -> dict:
    """Load ``task`` (optionally ``limit`` items: the first, or a seeded subset with ``subset="random"``; or
    another file in its format) and score it."""
    name = canonical_task(task)
    items = load_task(name, limit=limit, seed=seed, path=path, subset=subset)
    score = score_lambada if TASKS[name].kind == "lambada" else score_multiple_choice
    result = score(model, tokenizer, items, batch_size=batch_size, bos=bos, progress=progress)
    return {"task": name, "kind": TASKS[name].kind, "limit": limit, "subset": subset if limit else None,
            "seed": seed, **result}


def _check_items(items: Sequence[Item]) -> None:
    if not items:
        raise ValueError("no items to score")


def _mean(values: Iterable) -> float:
    arr = np.fromiter((float(v) for v in values), dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def finite_metrics(metrics: dict) -> tuple[dict, dict | None]:
    """Metrics safe to record: if any per-item log-likelihood or per-window loss is NaN or ±Inf, every
    aggregate computed from them (accuracy, perplexity, loss) becomes None, as does any other non-finite number;
    the second value counts the non-finite items or windows (None when all are finite)."""
    units = metrics.get("items") or metrics.get("window_losses") or []
    bad = sum(not all(map(math.isfinite, _unit_values(u))) for u in units)
    aggregate = {k: v for k, v in metrics.items() if isinstance(v, float)}
    if bad == 0 and all(map(math.isfinite, aggregate.values())):
        return metrics, None
    clean = {k: (None if k in aggregate and (bad or not math.isfinite(v)) else v) for k, v in metrics.items()}
    return finite_or_none(clean), {"units": bad, "of": len(units)}


def _unit_values(unit) -> list[float]:
    """The numbers of one item record (its ``ll``: a float or one per choice) or one window ``[nats, tokens]``."""
    if isinstance(unit, dict):
        ll = unit.get("ll", [])
        return [float(x) for x in (ll if isinstance(ll, list) else [ll])]
    return [float(x) for x in unit]


# ---------------------------------------------------------------------------------------------------- perplexity

def get_rolling_token_windows(token_list: Sequence[int], prefix_token: int, max_seq_len: int,
                              context_len: int) -> Iterator[tuple[list[int], list[int]]]:
    """lm-eval's rolling windows: ``(input tokens, predicted tokens)``, every token predicted exactly once.

    The first window predicts ``token_list[:max_seq_len]`` from ``[prefix_token] + token_list[:max_seq_len-1]``;
    each later window reads ``max_seq_len`` tokens and predicts the next ``max_seq_len - context_len + 1``.
    """
    if not 1 <= context_len <= max_seq_len:
        raise ValueError(f"context_len must lie in 1..{max_seq_len}, got {context_len}")
    token_list = list(token_list)
    if not token_list:
        return
    pred_len = max_seq_len - context_len + 1
    first = min(max_seq_len, len(token_list))
    yield [prefix_token, *token_list[:first - 1]], token_list[:first]
    predicted = first
    while predicted < len(token_list):
        n_pred = min(len(token_list) - predicted, pred_len)
        end = predicted + n_pred
        yield token_list[end - max_seq_len - 1:end - 1], token_list[end - n_pred:end]
        predicted += n_pred


def make_disjoint_window(pair: tuple[list[int], list[int]]) -> Request:
    """lm-eval: turn ``(input, predicted)`` into a ``(context, continuation)`` request with no overlap."""
    a, b = pair
    return a[:len(a) - (len(b) - 1)], b


def rolling_requests(token_ids: Sequence[int], max_len: int, stride: int | None = None) -> list[Request]:
    """Requests scoring ``token_ids[1:]`` given the prefix ``token_ids[0]`` (BOS), ``stride`` tokens per window."""
    stride = max_len if stride is None else stride
    if not 1 <= stride <= max_len:
        raise ValueError(f"stride must lie in 1..max_len={max_len}, got {stride}")
    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        raise ValueError("perplexity needs a prefix token and at least one token to score")
    windows = get_rolling_token_windows(ids[1:], ids[0], max_len, max_len - stride + 1)
    return [make_disjoint_window(w) for w in windows]


def rolling_perplexity(model, token_ids: Sequence[int] | np.ndarray | torch.Tensor, max_len: int | None = None,
                       stride: int | None = None, batch_size: int = 8, progress: bool = True) -> dict:
    """Perplexity of ``token_ids[1:]`` given ``token_ids[0]`` (BOS) by lm-eval's rolling windows.

    ``max_len`` defaults to the model's ``max_seq_len``; ``stride`` (tokens scored per window after the
    first) to ``max_len``. Returns ``loss`` (mean nats/token), ``perplexity``, ``tokens``, ``windows`` and
    ``window_losses`` (``[sum nats, tokens]`` per window, for :func:`diffquant.paired.bootstrap_ppl_ci`).
    """
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.flatten().tolist()
    max_len = max_len or model_max_len(model)
    requests = rolling_requests(token_ids, max_len, stride)
    scores = score_requests(model, requests, batch_size, max_len, progress, desc="perplexity")
    return _perplexity_summary(scores, max_len, stride)


def _perplexity_summary(scores: list[dict], max_len: int, stride: int | None) -> dict:
    window_losses = [[-s["ll"], s["tokens"]] for s in scores]
    nll = math.fsum(w[0] for w in window_losses)
    tokens = sum(w[1] for w in window_losses)
    return {"loss": nll / tokens, "perplexity": math.exp(nll / tokens), "tokens": tokens,
            "windows": len(window_losses), "max_len": max_len, "stride": stride or max_len,
            "window_losses": window_losses}


def _document_requests(tokenizer, docs, max_len: int, stride: int | None = None) -> tuple[list[Request], list[str]]:
    """The rolling-window requests of every non-empty document (the prefix token, BOS or else EOS, first, as
    lm-eval's ``loglikelihood_rolling``) and the texts of those documents."""
    prefix = _prefix_id(tokenizer)
    if prefix is None:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token to start each document with")
    requests, kept = [], []
    for doc in docs:
        text = getattr(doc, "text", doc)
        ids = _encode(tokenizer, text)
        if ids:
            requests += rolling_requests([prefix, *ids], max_len, stride)
            kept.append(text)
    if not kept:
        raise ValueError("no text to score: every document is empty")
    return requests, kept


def text_perplexity(model, tokenizer, text_or_docs, max_len: int | None = None, stride: int | None = None,
                    batch_size: int = 8, progress: bool = True) -> dict:
    """Rolling perplexity of a text or of documents (strings or objects with ``.text``), each document on its own.

    Each document is encoded with the prefix token (BOS) first, as lm-eval's ``loglikelihood_rolling``.
    Adds lm-eval's tokenizer-independent ``word_perplexity``, ``byte_perplexity`` and ``bits_per_byte``
    (words = ``re.split(r"\\s+", doc)``), which compare models with different tokenizers.
    """
    docs = [text_or_docs] if isinstance(text_or_docs, str) else text_or_docs
    max_len = max_len or model_max_len(model)
    requests, kept = _document_requests(tokenizer, docs, max_len, stride)
    scores = score_requests(model, requests, batch_size, max_len, progress, desc="perplexity")
    out = _perplexity_summary(scores, max_len, stride)
    nll = out["loss"] * out["tokens"]
    words = sum(len(re.split(r"\s+", d)) for d in kept)
    n_bytes = sum(len(d.encode("utf-8")) for d in kept)
    out.update(docs=len(kept), words=words, bytes=n_bytes, word_perplexity=math.exp(nll / words),
               byte_perplexity=math.exp(nll / n_bytes), bits_per_byte=nll / n_bytes / math.log(2))
    return out


# ---------------------------------------------------------------------------------------------------- subsets

def document_windows(tokenizer, docs, max_len: int) -> list[Request]:
    """The rolling-window requests of :func:`text_perplexity`, document by document."""
    return _document_requests(tokenizer, docs, max_len)[0]


LIMITED_KEYS = ("loss", "perplexity", "tokens", "windows", "windows_total", "max_len", "stride", "window_ids",
                "window_losses")


def perplexity_metrics(model, tokenizer, docs, limit: int | None = None, seed: int = 0, batch_size: int = 8,
                       progress: bool = True, subset: str = "first") -> dict:
    """Rolling perplexity of ``docs``: all windows (:func:`text_perplexity`) or ``limit`` of them, the first or
    (``subset="random"``) a seeded subset."""
    if limit is None:
        return text_perplexity(model, tokenizer, docs, batch_size=batch_size, progress=progress)
    max_len = model_max_len(model)
    requests = document_windows(tokenizer, docs, max_len)
    chosen = limit_ids(len(requests), limit, subset, seed)
    scores = score_requests(model, [requests[i] for i in chosen], batch_size, max_len, progress, desc="perplexity")
    out = {**_perplexity_summary(scores, max_len, None), "windows_total": len(requests), "window_ids": chosen}
    return {k: out[k] for k in LIMITED_KEYS}  # the order records have always had
