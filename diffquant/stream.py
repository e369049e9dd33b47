"""Streamed training data: exact teacher stories drawn on demand, never stored, never cycled.

A :class:`TokenStream` draws stories from a teacher with the exact sampler of :mod:`diffquant.sample` (float64
teacher and softmax, temperature 1) and cuts them into training windows of ``seq_len + 1`` tokens, numbered from 0;
step ``s`` of a run with batch ``B`` trains on windows ``s·B … s·B + B − 1``. Windows come in blocks of
``windows_per_block``; block ``b`` is drawn with a generator seeded by a hash of (purpose, seed, b) alone, so the
windows of step ``s`` are a function of (teacher, seed, s) and the stream's settings: two runs from one seed see the
same tokens, a resumed run redraws exactly the block it stopped in, and a Transformer/Diff pair on one seed is a
paired comparison. The batch size is not part of the stream, so runs at batch 16 and 128 on one seed read the same
windows in the same order (the steps-vs-tokens control). A block as small as one step gives every step its own
generator; larger blocks let the teacher decode hundreds of stories at once, which is what makes sampling fast
(``experiments/bench_stream.py``).

Fresh stories (purpose ``"fresh"``) come from generators no training step uses: they measure memorisation,
the per-token loss on fresh stories minus that on stories the model trained on (:func:`memorisation_check`).
For a streamed run every training token is new when it is seen, so memorisation is none by construction and the
measured gap only says how much the last steps' stories are remembered.

``cache_dir`` keeps each drawn block as a ``.npy`` file (named by the stream's identity hash), so the second arm of
a pair reads the blocks the first one drew instead of sampling them again. Arms that reach a block together draw
it once: the one that claims the block's lock file draws it, the others draw the next block meanwhile and then read
this one (a lock left by a process that died is taken over).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
import time
from pathlib import Path

import numpy as np
import torch

from .io import atomic_path
from .sample import PRECISION, sample_stories

log = logging.getLogger(__name__)

STREAM_FORMAT = 1
DEFAULT_BLOCK_TOKENS = 1 << 18  # ~720 stories of ~365 tokens: 256-story draws keep the CPU teacher busy
DEFAULT_DRAW_BATCH = 256
DEFAULT_MAX_LEN = 512  # stories up to 512 tokens, as `diffquant sample` draws them (stories260K's training context)
STREAMED_NOTE = "streamed: none by construction"
CHECK_STEPS = 8  # the memorisation check's training windows: the batches of this many evenly spread steps
LOCK_POLL_SECONDS = 1.0  # how often an arm waiting for another's block looks for it
STALE_LOCK_SECONDS = 3600.0  # a block takes about a minute to draw on one CPU core: an older lock was abandoned


def stream_seed(purpose: str, seed: int, index: int) -> int:
    """A 63-bit generator seed from (purpose, seed, index): independent streams for training and fresh stories."""
    digest = hashlib.sha256(f"diffquant-stream/{purpose}/{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class TokenStream:
    """Training windows of exact teacher samples, a function of (teacher, seed, step)."""

    def __init__(self, teacher: str | Path, seed: int, batch_size: int, seq_len: int, *, max_len: int | None = None,
                 draw_batch: int | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 device: str | torch.device = "cpu", cache_dir: str | Path | None = None):
        from .checkpoint import load_checkpoint
        from .checkpoint.files import WEIGHTS_FILE
        from .corpus import file_sha256
        from .tokenizer import tokenizer_for

        draw_batch = draw_batch or min(DEFAULT_DRAW_BATCH, max(8, block_tokens // 512))  # ~block / story length
        if min(batch_size, seq_len, draw_batch, block_tokens) <= 0:
            raise ValueError("batch size, sequence length, draw batch and block tokens must be positive")
        self.teacher_path = Path(teacher)
        self.tokenizer = tokenizer_for(self.teacher_path)
        if self.tokenizer.bos_id is None or self.tokenizer.path is None:
            raise ValueError(f"the tokenizer of {teacher} has no BOS token: stories cannot start")
        self.model = load_checkpoint(self.teacher_path, device=device, attn_impl="sdpa", dtype=PRECISION).eval()
        max_len = max_len or min(DEFAULT_MAX_LEN, self.model.config.max_seq_len)
        if not 2 <= max_len <= self.model.config.max_seq_len:
            raise ValueError(f"max_len must lie in 2..{self.model.config.max_seq_len} (the teacher's context), "
                             f"got {max_len}")
        self.seed, self.batch_size, self.seq_len = seed, batch_size, seq_len
        self.max_len, self.draw_batch = max_len, draw_batch
        self.windows_per_block = max(1, block_tokens // seq_len)
        self.bos_id = self.tokenizer.bos_id
        self.stop_ids = sorted({i for i in (self.tokenizer.eos_id, self.tokenizer.bos_id) if i is not None})
        self.identity = {
            "format": STREAM_FORMAT, "teacher_sha256": file_sha256(
                self.teacher_path / WEIGHTS_FILE if self.teacher_path.is_dir() else self.teacher_path),
            "tokenizer_sha256": file_sha256(self.tokenizer.path), "seed": seed,
            "seq_len": seq_len, "max_len": max_len, "draw_batch": draw_batch,
            "windows_per_block": self.windows_per_block, "bos_id": self.bos_id, "stop_ids": self.stop_ids,
            "precision": str(PRECISION).removeprefix("torch."),
        }
        self.identity_sha256 = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._blocks: dict[int, np.ndarray] = {}  # the last two drawn: a step can straddle two blocks
        self.keep_steps: set[int] = set()  # steps whose windows are kept for the memorisation check
        self.kept: dict[int, np.ndarray] = {}
        self._fresh: dict[int, np.ndarray] = {}
        self.tokens_drawn = 0
        self.seconds_drawing = 0.0

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def provenance(self) -> dict:
        """What a train log records about the data: the stream's settings and the hash standing for its tokens."""
        return {"streamed": True, "stream": {**self.identity, "teacher": str(self.teacher_path),
                                             "batch_size": self.batch_size},
                "train_tokens_sha256": self.identity_sha256}

    # -- drawing ------------------------------------------------------------------------------------------

    def draw_windows(self, purpose: str, index: int, n_windows: int) -> np.ndarray:
        """``n_windows`` windows of ``seq_len + 1`` tokens (consecutive windows share one token) cut from whole
        stories drawn with the generator of (purpose, seed, index); the last story's surplus is dropped."""
        gen = torch.Generator().manual_seed(stream_seed(purpose, self.seed, index))
        need = n_windows * self.seq_len + 1
        stories, total, start = [], 0, time.perf_counter()
        while total < need:
            batch = sample_stories(self.model, self.draw_batch, gen, self.bos_id, self.stop_ids, self.max_len)
            stories += batch
            total += sum(len(s) for s in batch)
        self.tokens_drawn += total
        self.seconds_drawing += time.perf_counter() - start
        ids = np.concatenate(stories)[:need].astype(np.int64)
        starts = np.arange(n_windows) * self.seq_len
        return ids[starts[:, None] + np.arange(self.seq_len + 1)]

    def block(self, index: int) -> np.ndarray:
        """The windows of block ``index`` (windows_per_block rows), drawn or read from the cache."""
        if index in self._blocks:
            return self._blocks[index]
        if self.cache_dir is None:
            windows = self.draw_windows("train", index, self.windows_per_block)
        else:
            windows = self._shared_block(index)
        self._blocks = {i: w for i, w in self._blocks.items() if i == index - 1}
        self._blocks[index] = windows
        return windows

    def _cache_path(self, index: int) -> Path:
        return self.cache_dir / f"stream-{self.identity_sha256[:16]}-{index:07d}.npy"

    def _lock_path(self, index: int) -> Path:
        path = self._cache_path(index)
        return path.with_name(path.name + ".lock")

    def _shared_block(self, index: int) -> np.ndarray:
        """Block ``index`` through the cache, drawn once by the processes sharing it: while another one draws it,
        this one draws the next block (so that neither core idles), then waits for it."""
        path, drew_ahead = self._cache_path(index), False
        while True:
            windows = self._cached(path) if path.is_file() else None
            if windows is None:
                windows = self._draw_to_cache(index)
            if windows is not None:
                return windows
            if not drew_ahead and not self._cache_path(index + 1).is_file():
                self._draw_to_cache(index + 1)
            else:
                self._wait_for_other()
            drew_ahead = True

    def _draw_to_cache(self, index: int) -> np.ndarray | None:
        """Draw block ``index`` into the cache under its lock; None while another live process holds the lock."""
        path, lock = self._cache_path(index), self._lock_path(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not _claim(lock):
            return None
        try:
            windows = self.draw_windows("train", index, self.windows_per_block)
            with atomic_path(path) as tmp:
                np.save(tmp, windows.astype(np.uint16 if self.vocab_size <= 1 << 16 else np.int32))
            return windows
        finally:
            lock.unlink(missing_ok=True)

    def _wait_for_other(self) -> None:
        time.sleep(LOCK_POLL_SECONDS)

    def _cached(self, path: Path) -> np.ndarray | None:
        """A cached block, or None where the file is not one of this stream's blocks (truncated, another shape,
        tokens out of the vocabulary): a cache only saves time, so such a block is drawn again and replaced."""
        try:
            windows = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            log.warning("stream cache %s is unreadable (%s): drawing the block again", path, err)
            return None
        shape = (self.windows_per_block, self.seq_len + 1)
        if (windows.shape != shape or windows.dtype.kind not in "iu"
                or (windows.size and (int(windows.min()) < 0 or int(windows.max()) >= self.vocab_size))):
            log.warning("stream cache %s holds %s %s, not this stream's %s token block: drawing it again",
                        path, windows.shape, windows.dtype, shape)
            return None
        return windows.astype(np.int64)

    def windows_at(self, step: int) -> np.ndarray:
        """The batch_size windows of training step ``step``."""
        first, last = step * self.batch_size, (step + 1) * self.batch_size  # window numbers [first, last)
        per = self.windows_per_block
        windows = np.concatenate([self.block(b)[max(first - b * per, 0):last - b * per]
                                  for b in range(first // per, (last - 1) // per + 1)])
        if step in self.keep_steps:
            self.kept[step] = windows
        return windows

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        xy = torch.from_numpy(self.windows_at(step))
        return xy[:, :-1], xy[:, 1:]

    def trained_windows(self, steps: list[int]) -> np.ndarray:
        """The windows of already-trained ``steps``: kept ones as they were, the others (before a resume) redrawn."""
        return np.concatenate([self.kept[s] if s in self.kept else self.windows_at(s) for s in steps])

    def fresh_windows(self, n_windows: int) -> np.ndarray:
        """Windows of stories no training step draws (purpose "fresh"; kept, since every check asks the same)."""
        if n_windows not in self._fresh:
            self._fresh[n_windows] = self.draw_windows("fresh", 0, n_windows)
        return self._fresh[n_windows]


def _claim(lock: Path) -> bool:
    """Create ``lock`` naming this host and process; False while a live process holds it (one that died, or a lock
    older than STALE_LOCK_SECONDS, is taken over)."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _lock_held(lock):
                return False
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
        return True
    return False


def _lock_held(lock: Path) -> bool:
    """Whether ``lock`` still stands for a process drawing its block."""
    try:
        age = time.time() - lock.stat().st_mtime
        host, pid = lock.read_text().split()
        pid = int(pid)
    except FileNotFoundError:
        return False
    except ValueError:  # being written this instant, or left half-written long ago
        return age < STALE_LOCK_SECONDS
    if age >= STALE_LOCK_SECONDS:
        return False
    if host != socket.gethostname() or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def check_steps(total_steps: int, count: int = CHECK_STEPS) -> list[int]:
    """``count`` training steps spread evenly over ``range(total_steps)`` (each the middle of its stretch)."""
    return sorted({min(total_steps - 1, int((i + 0.5) * total_steps / count)) for i in range(count)})


@torch.no_grad()
def window_losses(model, windows: np.ndarray, batch_size: int, device: str, bf16: bool = False) -> np.ndarray:
    """Each window's mean next-token cross-entropy (nats/token), float64."""
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, len(windows), batch_size):
        w = torch.from_numpy(np.ascontiguousarray(windows[i:i + batch_size])).to(device)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), w[:, 1:].flatten(), reduction="none")
        out.append(loss.view(len(w), -1).mean(dim=1).cpu().numpy())
    model.train(was_training)
    return np.concatenate(out)


def memorisation_check(model, trained: np.ndarray, fresh: np.ndarray, batch_size: int, device: str,
                       bf16: bool = False) -> dict:
    """Per-token loss on fresh teacher stories minus on training stories, with its standard error (windows of
    equal length are the units: the mean of their means is the per-token mean)."""
    lt = window_losses(model, trained, batch_size, device, bf16)
    lf = window_losses(model, fresh, batch_size, device, bf16)
    se = math.sqrt(lf.var(ddof=1) / len(lf) + lt.var(ddof=1) / len(lt)) if min(len(lf), len(lt)) > 1 else None
    return {"gap": float(lf.mean() - lt.mean()), "se": se, "fresh_loss": float(lf.mean()),
            "train_loss": float(lt.mean()), "fresh_windows": len(lf), "train_windows": len(lt),
            "tokens_per_window": int(trained.shape[1] - 1)}
