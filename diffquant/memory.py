"""Memory needed by a run, estimated from its arguments before anything is allocated, and refused in one line
when it cannot fit (how much it needs and how much is free), instead of an allocation failure or a swapping
machine minutes later.

The estimates are lower bounds — the few tensors a run must hold at once (a KV cache, a batch's logits and
their softmax, a training batch's activations) — so a refusal is certain, never a guess; what is free is the
device's free memory (CUDA) or the smaller of the kernel's ``MemAvailable`` and the cgroup's limit (CPU).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .config import ModelConfig
from .errors import UserError

log = logging.getLogger(__name__)

__all__ = ["MemoryNeeded", "available_bytes", "check_fits", "forward_bytes", "human", "kv_cache_bytes",
           "train_bytes"]


class MemoryNeeded(UserError):
    """A run that cannot fit in the memory of its device (one-line message with both numbers)."""


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def kv_cache_bytes(cfg: ModelConfig, batch: int, max_len: int, itemsize: int) -> int:
    """Keys and values of every layer for ``batch`` sequences of ``max_len`` positions (diffquant.model.KVCache)."""
    per_position = cfg.n_kv_heads * cfg.sub_heads_per_head * cfg.head_dim * 2  # keys + values, same width
    return cfg.n_layers * batch * max_len * per_position * itemsize


def forward_bytes(cfg: ModelConfig, batch: int, seq_len: int, itemsize: int = 4) -> int:
    """One inference forward of ``batch`` x ``seq_len``: the logits and their float32 log-softmax."""
    return batch * seq_len * cfg.vocab_size * (itemsize + 4)


def train_bytes(cfg: ModelConfig, batch: int, seq_len: int, itemsize: int = 4) -> int:
    """One training step (activations of ``itemsize`` bytes: 2 under bf16 autocast): the logits, their float32
    copy and its gradient, and per layer the activations autograd keeps (the residual stream and norms, q/k/v,
    the attention output and the SwiGLU's three hidden-width tensors)."""
    tokens = batch * seq_len
    logits = tokens * cfg.vocab_size * (itemsize + 8)
    per_layer = tokens * (4 * cfg.d_model + 3 * cfg.q_dim + 3 * cfg.ffn_dim) * itemsize
    return logits + cfg.n_layers * per_layer


def available_bytes(device: str = "cpu") -> int | None:
    """Free memory of ``device`` in bytes; None where it cannot be told (then nothing is refused)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0] if torch.cuda.is_available() else None
    if dev.type != "cpu":
        return None
    found = [v for v in (_meminfo_available(), _cgroup_free()) if v is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_free() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        stat = dict(line.split() for line in Path("/sys/fs/cgroup/memory.stat").read_text().splitlines())
        used -= int(stat.get("inactive_file", 0))  # page cache the kernel reclaims on demand
        return max(0, int(limit) - used)
    except (OSError, ValueError):
        return None


def check_fits(needed: int, device: str, what: str, hint: str = "") -> None:
    """Refuse (MemoryNeeded) ``what`` when it needs more than ``device`` has free. ``DIFFQUANT_NO_MEMORY_CHECK=1``
    skips the check (memory that the kernel frees only on demand, e.g. page cache under a cgroup)."""
    if os.environ.get("DIFFQUANT_NO_MEMORY_CHECK") == "1":
        return
    free = available_bytes(device)
    if free is not None and needed > free:
        raise MemoryNeeded(f"{what} needs at least {human(needed)} on {device} but only {human(free)} is free"
                           + (f"; {hint}" if hint else ""))
    log.debug("%s: about %s of %s free", what, human(needed), human(free) if free is not None else "unknown")
