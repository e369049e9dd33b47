"""Greedy decoding, for checking that a loaded model speaks (e.g. stories260K's documented sample)."""

from __future__ import annotations

import torch

from .model import LM


@torch.inference_mode()
def greedy_generate(model: LM, input_ids: torch.Tensor, n: int, eos_id: int | None = None) -> torch.Tensor:
    """``input_ids`` [B, T] followed by ``n`` argmax tokens -> [B, T + n] (fewer if every row hit ``eos_id``).

    No KV cache: each step re-runs the whole prefix (cheap for the small models here). Past
    ``max_seq_len`` only the last ``max_seq_len`` tokens are fed. A row that produced ``eos_id`` keeps
    emitting it so rows stay aligned.
    """
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [B, T] with T >= 1, got {tuple(input_ids.shape)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    ids = input_ids.to(torch.long)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    window = model.config.max_seq_len
    for _ in range(n):
        logits = model(ids[:, -window:])[:, -1]  # (B, V)
        nxt = logits.argmax(dim=-1)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done |= nxt == eos_id
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    return ids
