"""Training: AdamW, warm-up then cosine/linear decay, clipping, optional bf16 autocast, resumable, logged.

Both archs see **the same token order**: the windows of step ``s`` depend only on (seed, s), never on the
model or on torch's global RNG, so a Transformer/Diff pair trained with one seed is a paired comparison and
a resumed run draws exactly the batches an uninterrupted one would. There is no dropout, so with the model
and optimizer state restored bit for bit a resume continues bit-identically.

State is saved without pickle: the model as a checkpoint folder, AdamW's moments in safetensors and the
scalars in JSON (``state/``). Ctrl-C (and ``kill`` of ``diffquant train``) saves that state before leaving.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checkpoint import checkpoint_format, load_checkpoint, save_checkpoint
from .checkpoint.files import read_tensors
from .config import ModelConfig
from .errors import UserError
from .io import (
    atomic_dir,
    atomic_path,
    atomic_write_text,
    compact_json_object,
    finite_or_none,
    read_json_file,
    write_safetensors,
)
from .memory import check_fits, train_bytes
from .model import LM, build_model, num_params
from .progress import progress_bar
from .stream import STREAMED_NOTE, TokenStream, check_steps, memorisation_check
from .tracking import outlier_point

log = logging.getLogger(__name__)

STATE_DIR, FINAL_DIR, SNAPSHOT_DIR, LOG_FILE = "state", "final", "snapshots", "train_log.json"
BRANCH_DIR = "branches"  # resumable states of the stable phase: cooldowns branch from them
SCHEDULES = ("cosine", "linear", "constant", "wsd")
# Eager attention (always for the clipped arm) in chunks of this many queries: score tensors that fit in cache
# make a clipped xs training step ~5x faster on CPU than whole 512x512 maps (experiments/bench_train.py).
EAGER_CHUNK = 64
# Settings a cooldown branch must share with the run it branches from (same model, same data order).
BRANCH_KEYS = ("batch_size", "seq_len", "lr", "seed", "beta1", "beta2", "weight_decay", "warmup_steps", "init")
# a resume continues the same run: the branch's keys and the schedule
RESUME_KEYS = BRANCH_KEYS + ("tokens", "schedule", "decay_start", "cooldown_frac", "min_lr_ratio", "grad_clip")


@dataclass(frozen=True)
class TrainConfig:
    tokens: int  # training budget; steps = tokens // (batch_size · seq_len)
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"  # "cosine" | "linear" | "constant" | "wsd" (warm-up, stable, linear decay)
    decay_start: int | None = None  # wsd: the step the decay starts (None: the last cooldown_frac of the steps)
    cooldown_frac: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    bf16: bool = False
    device: str = "cpu"
    seed: int = 0
    eval_every: int = 250
    eval_tokens: int = 65536
    save_every: int = 100
    snapshots: tuple[float, ...] = (0.1, 0.3, 1.0)  # fractions of the budget kept as fp16 checkpoints
    init: str = "normal"  # "normal" (N(0, 0.02), GPT-2 style) | "default" (PyTorch's Linear init, as official Diff)
    branch_every: int = 0  # keep a resumable state every this many steps, to branch cooldowns from; 0: none
    track_every: int = 0  # log per-layer outliers on a fixed validation batch every this many steps; 0: never
    track_windows: int = 4  # windows of seq_len tokens in that batch
    compile: bool = False  # torch.compile the training forward (opt-in: slower on the CPU, see bench_train.py)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if not 0 <= self.cooldown_frac <= 1 or (self.decay_start is not None and self.decay_start < 0):
            raise ValueError("cooldown_frac must lie in [0, 1] and decay_start must not be negative")
        if min(self.branch_every, self.track_every) < 0 or self.track_windows <= 0:
            raise ValueError("branch_every and track_every must be >= 0, track_windows positive")
        if self.tokens < self.batch_size * self.seq_len:
            raise ValueError(f"token budget {self.tokens} is smaller than one batch "
                             f"({self.batch_size} x {self.seq_len} = {self.batch_size * self.seq_len} tokens)")
        if min(self.batch_size, self.seq_len, self.eval_every, self.save_every) <= 0:
            raise ValueError("batch_size, seq_len, eval_every and save_every must be positive")

    @property
    def steps(self) -> int:
        return self.tokens // (self.batch_size * self.seq_len)

    @property
    def decay_step(self) -> int:
        """wsd: the first step of the linear decay."""
        if self.decay_start is not None:
            return self.decay_start
        return self.steps - round(self.cooldown_frac * self.steps)

    def snapshot_steps(self) -> list[int]:
        return sorted({max(1, round(f * self.steps)) for f in self.snapshots})


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine or linear decay to cfg.lr · min_lr_ratio at the last step; or
    constant; or wsd: constant until ``decay_step``, then linear decay to the floor (a cooldown branch)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant" or (cfg.schedule == "wsd" and step < cfg.decay_step):
        return cfg.lr
    if cfg.schedule == "wsd":
        progress = (step - cfg.decay_step) / max(1, cfg.steps - cfg.decay_step)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * (1 - progress))
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay)


def _windows_at(data: np.ndarray, step: int, cfg: TrainConfig) -> np.ndarray:
    """Random windows of seq_len+1 tokens, a function of (seed, step) only: identical for both archs."""
    if len(data) <= cfg.seq_len + 1:
        raise ValueError(f"training data has {len(data)} tokens, fewer than one window of {cfg.seq_len + 1}")
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen).numpy()
    return np.stack([data[s:s + cfg.seq_len + 1] for s in starts]).astype(np.int64)


def batch_at(data: np.ndarray, step: int, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and targets from a corpus (:func:`_windows_at`)."""
    xy = torch.from_numpy(_windows_at(data, step, cfg))
    return xy[:, :-1], xy[:, 1:]


def corpus_windows(data: np.ndarray, steps: list[int], cfg: TrainConfig) -> np.ndarray:
    """The windows (seq_len + 1 tokens each) that training read from a corpus at ``steps``, one row each."""
    return np.concatenate([_windows_at(data, s, cfg) for s in steps])


def training_batch(data: np.ndarray | TokenStream, step: int, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch: random windows of a fixed corpus, or a streamed teacher's windows of that step."""
    return data.batch(step) if isinstance(data, TokenStream) else batch_at(data, step, cfg)


def eval_windows(data: np.ndarray, seq_len: int, max_tokens: int) -> torch.Tensor:
    """Contiguous, non-overlapping windows of seq_len+1 tokens from the start of ``data`` (fixed)."""
    n = min(max_tokens // seq_len, (len(data) - 1) // seq_len)
    if n == 0:
        raise ValueError(f"validation data has {len(data)} tokens, fewer than one window of {seq_len + 1}")
    return torch.stack([torch.from_numpy(data[i * seq_len:(i + 1) * seq_len + 1].astype(np.int64))
                        for i in range(n)])


@torch.no_grad()
def mean_loss(model: LM, windows: torch.Tensor, batch_size: int, device: str, bf16: bool = False) -> float:
    """Mean next-token cross-entropy (nats/token) over the windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        w = windows[i:i + batch_size].to(device)
        with _autocast(device, bf16):
            logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total += loss.item()
        count += w[:, 1:].numel()
    model.train(was_training)
    return total / count


def _autocast(device: str, bf16: bool):
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)


def make_optimizer(model: LM, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; no weight decay on norms, λ vectors and embeddings (nor the tied head)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # named_parameters yields a tied tensor once
        skip = p.ndim < 2 or name.startswith("embed.") or "lambda_" in name
        (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = torch.device(cfg.device).type == "cuda"  # one kernel for all parameters: launches bound xs on a GPU
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, fused=fused)


# -- resumable state without pickle -----------------------------------------------------------------------

def save_state(folder: Path, model: LM, opt: torch.optim.AdamW, step: int, history: dict, cfg: TrainConfig,
               files: dict[str, Path] | None = None, data: dict | None = None) -> None:
    """A resumable state in ``folder``: the model (a checkpoint), AdamW's moments and the trainer's scalars,
    with ``data`` (the sha256 of the train and validation tokens) so a resume or branch can check its data."""
    tensors = {}
    for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
        st = opt.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in st:
                tensors[f"{i}.{key}"] = st[key].detach().cpu().contiguous()
    with atomic_dir(folder) as tmp:
        save_checkpoint(model, tmp / "model", files=files)
        write_safetensors(tensors, tmp / "optimizer.safetensors")
        (tmp / "trainer.json").write_text(json.dumps({"step": step, "history": history, "data": data,
                                                      "train_config": dataclasses.asdict(cfg)}, allow_nan=False))


def load_state(out: Path, device: str) -> tuple[LM, dict[str, torch.Tensor], int, dict]:
    """The resumable state of the run in ``out``."""
    return load_state_dir(Path(out) / STATE_DIR, device)[:4]


def load_state_dir(state: Path, device: str) -> tuple[LM, dict[str, torch.Tensor], int, dict, dict]:
    """(model, optimizer moments, step, history, train config) of a state folder (``state/`` or a branch),
    each part checked (:func:`read_trainer_json`); the data fingerprint is :func:`state_data`'s."""
    if not (state / "trainer.json").is_file():
        raise FileNotFoundError(f"no resumable state in {state} (expected {state}/trainer.json)")
    meta = read_trainer_json(state)
    model = load_checkpoint(state / "model", device=device).train()
    moments = {k: v.to(device) for k, v in read_tensors(state / "optimizer.safetensors").items()}
    return model, moments, meta["step"], meta["history"], meta["train_config"]


def read_trainer_json(state: Path) -> dict:
    """``trainer.json`` checked: the fields a resume relies on, of the right types, the step within the saved
    budget and equal to the number of logged steps (an edited step or a deleted config is refused)."""
    file = state / "trainer.json"
    meta = read_json_file(file)
    cfg, history, step = meta.get("train_config"), meta.get("history"), meta.get("step")
    if not isinstance(cfg, dict) or not all(_is_int(cfg.get(k)) and cfg[k] > 0
                                            for k in ("tokens", "batch_size", "seq_len")):
        raise ValueError(f"{file}: train_config is missing or damaged; the state cannot be checked against the "
                         "run (train again into a new --out)")
    if not isinstance(history, dict) or not isinstance(history.get("train_loss"), list) \
            or not isinstance(history.get("val", []), list) or not isinstance(history.get("wall_s", 0.0), (int, float)):
        raise ValueError(f"{file}: history is missing or damaged")
    steps = cfg["tokens"] // (cfg["batch_size"] * cfg["seq_len"])
    if not _is_int(step) or not 0 <= step <= steps or step != len(history["train_loss"]):
        raise ValueError(f"{file}: step {step!r} is not a step of this run (0..{steps}, with "
                         f"{len(history['train_loss'])} logged)")
    if meta.get("data") is not None and not isinstance(meta["data"], dict):
        raise ValueError(f"{file}: data must be an object")
    return meta


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def state_data(state: Path) -> dict | None:
    """The data fingerprint a state was trained on (trainer.json; states before it: the run's train_log.json)."""
    data = read_trainer_json(state).get("data")
    if data is None:
        for log_file in (state.parent / LOG_FILE, state.parent.parent / LOG_FILE):  # RUN/state, RUN/branches/stepN
            if log_file.is_file():
                return read_json_file(log_file).get("data")
    return data


def restore_optimizer(opt: torch.optim.AdamW, moments: dict[str, torch.Tensor], where: str = "the state") -> None:
    for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
        if f"{i}.exp_avg" in moments:
            state = {k: moments.get(f"{i}.{k}") for k in ("step", "exp_avg", "exp_avg_sq")}
            if any(v is None for v in state.values()) or state["exp_avg"].shape != p.shape \
                    or state["exp_avg_sq"].shape != p.shape or state["step"].numel() != 1:
                raise ValueError(f"{where}/optimizer.safetensors does not match the model (parameter {i}); "
                                 "the state is damaged")
            opt.state[p] = {k: v.clone() for k, v in state.items()}


# -- the loop ---------------------------------------------------------------------------------------------

def train(
    model_cfg: ModelConfig, cfg: TrainConfig, out: str | Path, train_data: np.ndarray | TokenStream,
    val_data: np.ndarray, resume: bool = False, init_from: str | Path | None = None, provenance: dict | None = None,
    branch_from: str | Path | None = None, files: dict[str, Path] | None = None, stop_at: int | None = None,
    fresh: TokenStream | None = None,
) -> dict:
    """Train into ``out`` (state/, snapshots/, final/, branches/, train_log.json) and return the log as a dict.

    ``resume`` continues the run saved in ``out/state``; ``init_from`` starts a new run from the weights of
    a checkpoint (e.g. a shipped model, to train it further); ``branch_from`` starts a new run from a saved
    state (``RUN/branches/stepN``) and continues its step count, optimizer and history — with a ``wsd``
    schedule whose ``decay_start`` is that step this is a cooldown branch. ``files`` (name -> path, e.g. the
    tokenizer) are copied into every checkpoint the run writes. ``stop_at`` ends this call after that step
    with the resumable state saved and no final checkpoint: the schedule is still ``cfg``'s, so a resume
    continues as if uninterrupted (a campaign stops at a branch to cool it, then goes on).

    ``train_data`` is a token corpus (random windows) or a :class:`~diffquant.stream.TokenStream` (fresh teacher
    stories every step). When the run finishes, the log gets a memorisation check (loss on fresh teacher stories
    minus on training stories) if a teacher is at hand: the stream's own, or ``fresh`` for a corpus run.
    """
    out = Path(out)
    device = cfg.device
    if stop_at is not None and stop_at <= 0:
        raise ValueError(f"stop_at must be a positive step, not {stop_at}")
    end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    check_fits(train_bytes(model_cfg, cfg.batch_size, cfg.seq_len, 2 if cfg.bf16 else 4), device,
               f"a training step of {cfg.batch_size} x {cfg.seq_len} tokens", "lower --batch-size or --seq-len")
    data = data_fingerprint(train_data, val_data)
    if resume:
        model, moments, start, history, saved_cfg = load_state_dir(out / STATE_DIR, device)
        _check_same_model(model.config, model_cfg, out / STATE_DIR)
        _check_same_run(saved_cfg, cfg, start, out / STATE_DIR)
        _check_same_data(out / STATE_DIR, data)
    else:
        _check_fresh(out)
        if branch_from:
            model, moments, start, history, origin = load_state_dir(Path(branch_from), device)
            _check_branch(model.config, model_cfg, origin, cfg, start, Path(branch_from))
            _check_same_data(Path(branch_from), data)
        else:
            model = _init_model(model_cfg, cfg, init_from, device)
            moments, start = None, 0
            history = {"train_loss": [], "val": [], "wall_s": 0.0}
        model.to(device).train()
    history.setdefault("outliers", [])
    model.set_attn_impl(model.config.attn_impl, chunk=EAGER_CHUNK)  # only eager attention (clipped) reads it
    opt = make_optimizer(model, cfg)
    if moments:
        restore_optimizer(opt, moments, str(branch_from or out / STATE_DIR))
    val = eval_windows(val_data, cfg.seq_len, cfg.eval_tokens)
    track = val[:cfg.track_windows, :-1].contiguous()
    log_base = _log_header(model, cfg, out, train_data, init_from, provenance, branch_from, data)
    checks = check_steps(cfg.steps)
    if isinstance(train_data, TokenStream):
        train_data.keep_steps = set(checks)

    def save(step: int, folder: Path) -> None:
        _check_finite(model, step)  # never replace a good state by a diverged one
        save_state(folder, model, opt, step, history, cfg, files, data)

    forward = torch.compile(model) if cfg.compile else model  # shares the parameters: saving reads ``model``
    t_start, wall_before = time.time(), history["wall_s"]
    bar = progress_bar(total=cfg.steps, initial=start, desc=f"train {model.config.arch}", mininterval=5,
                       dynamic_ncols=True)
    if start == 0 and cfg.track_every:
        _track(model, track, history, 0, cfg)
    try:
        for step in range(start, end):
            loss = _train_step(forward, opt, cfg, train_data, step)
            history["train_loss"].append(round(loss, 6))
            done = step + 1
            elapsed = wall_before + time.time() - t_start
            bar.update(1)
            tok_s = (done - start) * cfg.batch_size * cfg.seq_len / max(1e-9, time.time() - t_start)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:.0f}")
            if done % cfg.eval_every == 0 or done == cfg.steps:
                vloss = mean_loss(model, val, cfg.batch_size, device, cfg.bf16)
                if not math.isfinite(vloss):
                    raise TrainingDiverged(f"training diverged by step {done}: the validation loss is {vloss}")
                history["val"].append({"step": done, "tokens": done * cfg.batch_size * cfg.seq_len, "loss": vloss})
                log.info("step %d: train %.4f, validation %.4f", done, loss, vloss)
            if cfg.track_every and (done % cfg.track_every == 0 or done == cfg.steps):
                _track(model, track, history, done, cfg)
            if done in cfg.snapshot_steps():
                snap = out / SNAPSHOT_DIR / f"step{done:06d}"
                _check_finite(model, done)
                save_checkpoint(model, snap, overwrite=True, dtype=torch.float16, files=files,
                                metadata={"step": str(done), "tokens": str(done * cfg.batch_size * cfg.seq_len)})
            if cfg.branch_every and done % cfg.branch_every == 0 and done < cfg.steps:
                history["wall_s"] = elapsed
                save(done, out / BRANCH_DIR / f"step{done:06d}")
            if done % cfg.save_every == 0 or done == cfg.steps:
                history["wall_s"] = elapsed
                save(done, out / STATE_DIR)
                _write_log(out, log_base, history, done)
    except TrainingDiverged:
        history["diverged_at"] = len(history["train_loss"])
        _write_log(out, log_base, history, history["diverged_at"])
        raise
    except KeyboardInterrupt:
        history["wall_s"] = wall_before + time.time() - t_start
        done = len(history["train_loss"])
        save(done, out / STATE_DIR)
        _write_log(out, log_base, history, done)
        log.warning("interrupted at step %d; resumable state saved in %s", done, out / STATE_DIR)
        raise
    finally:
        bar.close()
    if end < cfg.steps:
        if start < end:
            history["wall_s"] = wall_before + time.time() - t_start
        return _pause(out, log_base, history, start, end, save)
    _check_finite(model, cfg.steps)
    save_checkpoint(model, out / FINAL_DIR, overwrite=True, dtype=torch.float16, files=files,
                    metadata={"step": str(cfg.steps), "tokens": str(cfg.steps * cfg.batch_size * cfg.seq_len)})
    log_base["memorisation"] = _memorisation(model, train_data, fresh, cfg, checks)
    return _write_log(out, log_base, history, cfg.steps)


def _pause(out: Path, log_base: dict, history: dict, start: int, end: int, save) -> dict:
    """Leave a run at step ``end`` (before its budget) with its state saved, or as it was if already past."""
    if start >= end:
        log.info("%s is at step %d, not before step %d: nothing to train", out, start, end)
        return _write_log(out, log_base, history, start)
    save(end, out / STATE_DIR)
    log.info("stopped at step %d; the run continues with resume", end)
    return _write_log(out, log_base, history, end)


def _check_same_model(saved: ModelConfig, requested: ModelConfig, where: Path) -> None:
    a, b = (dataclasses.replace(c, attn_impl="eager").to_dict() for c in (saved, requested))
    changed = [f"{k} {a[k]} (asked {b[k]})" for k in a if a[k] != b.get(k)]
    if changed:
        raise ValueError(f"{where} holds a different model than the one requested: {', '.join(changed[:4])} "
                         "(check --arch and --preset)")


# what a run folder may hold when its process was killed before the first saved state (nothing to resume)
UNSAVED_RUN = (SNAPSHOT_DIR, BRANCH_DIR)


def _check_fresh(out: Path) -> None:
    """A new run needs an empty ``out``, or one left by a run killed before its first saved state (only
    snapshots, which the new run writes again): that one is started over with a warning."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder; choose another --out")
    entries = [p for p in out.iterdir() if ".diffquant-tmp-" not in p.name]
    if not entries:
        return
    if (out / STATE_DIR).exists() or (out / FINAL_DIR).exists() or any(p.name not in UNSAVED_RUN for p in entries):
        raise FileExistsError(f"{out} is not empty: add --resume to continue the run saved there, or choose "
                              "another --out")
    log.warning("%s holds a run killed before its first saved state; starting it over", out)


def _init_model(model_cfg: ModelConfig, cfg: TrainConfig, init_from, device: str) -> LM:
    """A new model, or the float weights of ``init_from`` (checked to be the model asked for)."""
    if not init_from:
        return build_model(model_cfg, seed=cfg.seed, init=cfg.init)
    if checkpoint_format(init_from) == "packed":
        raise ValueError(f"--init-from {init_from} is a packed quantized checkpoint; training needs float weights "
                         "(give the float checkpoint it was quantized from)")
    model = load_checkpoint(init_from, device=device)
    _check_same_model(model.config, model_cfg, Path(init_from))
    return model


def _check_finite(model: LM, step: int) -> None:
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise TrainingDiverged(f"training diverged by step {step}: {bad[0]} holds NaN or Inf (lower --lr); the "
                               "last saved state is kept")


def data_fingerprint(train_data: np.ndarray | TokenStream, val_data: np.ndarray) -> dict:
    """Hashes naming the training and validation tokens (a stream: the hash of its identity, which fixes them)."""
    train = train_data.identity_sha256 if isinstance(train_data, TokenStream) else \
        hashlib.sha256(train_data.tobytes()).hexdigest()
    return {"train_tokens_sha256": train,
            "val_tokens_sha256": hashlib.sha256(val_data.tobytes()).hexdigest()}


def _changed_keys(saved: dict, cfg: TrainConfig, keys) -> list[str]:
    """The ``keys`` a saved train config holds with other values than ``cfg`` (older states lack some)."""
    return [k for k in keys if k in saved and saved[k] != getattr(cfg, k)]


def _resume_keys(cfg: TrainConfig, start: int) -> list[str]:
    """The RESUME_KEYS that decide the steps after ``start``: before any decay (constant, or wsd short of an
    explicit decay_start) the budget may grow or shrink, and what the schedule never reads may change."""
    unread = set()
    if cfg.schedule == "constant" or (cfg.schedule == "wsd" and start < (cfg.decay_start or -1)):
        unread.add("tokens")
    if cfg.schedule != "wsd":
        unread.add("decay_start")
    if cfg.schedule != "wsd" or cfg.decay_start is not None:
        unread.add("cooldown_frac")
    if cfg.schedule == "constant":
        unread.add("min_lr_ratio")
    return [k for k in RESUME_KEYS if k not in unread]


def _check_same_run(saved: dict, cfg: TrainConfig, start: int, where: Path) -> None:
    keys = _resume_keys(cfg, start)
    changed = [f"{k} {saved[k]} (asked {getattr(cfg, k)})" for k in _changed_keys(saved, cfg, keys)]
    if changed:
        raise ValueError(f"{where} was trained with {', '.join(changed)}; a resume must keep them "
                         "(--branch-from starts a new run from it)")


def _check_same_data(state: Path, data: dict) -> None:
    """The state was trained on these tokens (its trainer.json's fingerprint; older states: the run's log)."""
    saved = state_data(state)
    if not saved or any(not isinstance(saved.get(k), str) for k in data):
        raise ValueError(f"{state} does not record which tokens it was trained on; it cannot be checked against "
                         "--data (train again into a new --out)")
    for key in data:
        if saved[key] != data[key]:
            raise ValueError(f"{state} was trained on other {key.split('_')[0]} tokens ({key} differs); a resume "
                             "or branch must use the same data")


def _check_branch(saved: ModelConfig, requested: ModelConfig, origin: dict, cfg: TrainConfig, start: int,
                  where: Path) -> None:
    """A branch continues its run: same model, same data order and optimizer settings, more steps."""
    _check_same_model(saved, requested, where)
    changed = _changed_keys(origin, cfg, BRANCH_KEYS)
    if changed:
        raise ValueError(f"{where} was trained with other {', '.join(changed)}; a branch must keep them")
    if cfg.steps <= start:
        raise ValueError(f"{where} is at step {start}; the branch's budget ({cfg.steps} steps) must go beyond it")


def _track(model: LM, batch: torch.Tensor, history: dict, step: int, cfg: TrainConfig) -> None:
    point = outlier_point(model, batch.to(cfg.device))
    history["outliers"].append({"step": step, "tokens": step * cfg.batch_size * cfg.seq_len, "layers": point})


class TrainingDiverged(UserError):
    """A non-finite training loss (e.g. too high a learning rate); the run's log records the step."""


def _train_step(model, opt: torch.optim.AdamW, cfg: TrainConfig, data, step: int) -> float:
    x, y = training_batch(data, step, cfg)
    x, y = x.to(cfg.device), y.to(cfg.device)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    with _autocast(cfg.device, cfg.bf16):
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    if not torch.isfinite(loss):
        raise TrainingDiverged(f"training diverged at step {step}: loss is {loss.item()}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return loss.item()


def _memorisation(model: LM, train_data, fresh: TokenStream | None, cfg: TrainConfig, steps: list[int]):
    """The memorisation check on the batches of ``steps`` (None without a teacher to draw fresh stories from)."""
    streamed = isinstance(train_data, TokenStream)
    source = train_data if streamed else fresh
    if source is None:
        return None
    trained = train_data.trained_windows(steps) if streamed else corpus_windows(train_data, steps, cfg)
    result = memorisation_check(model, trained, source.fresh_windows(len(trained)), cfg.batch_size, cfg.device,
                                cfg.bf16)
    log.info("memorisation: fresh − training loss %.4f ± %.4f nats/token", result["gap"], result["se"] or 0)
    return {"note": STREAMED_NOTE if streamed else "fixed corpus", "steps": steps, **result}


def _data_header(train_data) -> dict:
    """What the log says about the training data beyond its fingerprint."""
    if isinstance(train_data, TokenStream):
        return {k: v for k, v in train_data.provenance().items() if k != "train_tokens_sha256"}
    return {"train_tokens_available": len(train_data)}


def _log_header(model, cfg, out, train_data, init_from, provenance, branch_from, data) -> dict:
    return {
        "branch_from": str(branch_from) if branch_from else None,
        "model_config": model.config.to_dict(),
        "train_config": dataclasses.asdict(cfg),
        "parameters": num_params(model),
        "seed": cfg.seed,
        "init_from": str(init_from) if init_from else None,
        "data": {**data, **_data_header(train_data), **(provenance or {})},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "flush_denormal": torch.tensor([1e-40]).item() == 0.0,  # denormals flushed to zero (commands/train.py)
        "out": str(out),
    }


def _write_log(out: Path, base: dict, history: dict, step: int) -> dict:
    record = {**base, "step": step, "tokens_seen": step * base["train_config"]["batch_size"]
              * base["train_config"]["seq_len"], "history": history}
    atomic_write_text(out / LOG_FILE, compact_json_object(finite_or_none(record)))
    return record


def split_tokens(split: str, tokenizer=None, cache_dir: str | Path | None = None) -> tuple[np.ndarray, dict]:
    """Token ids of a calib split with the project tokenizer, cached as .npy keyed by text and tokenizer hashes."""
    from .data import data_fingerprint, load_split
    from .tokenizer import default_tokenizer

    tokenizer = tokenizer or default_tokenizer()
    docs = load_split(split)
    tok_hash = hashlib.sha256(Path(tokenizer.path).read_bytes()).hexdigest() if tokenizer.path else "memory"
    info = {f"{split}_text_sha256": data_fingerprint(docs), "tokenizer_sha256": tok_hash}
    cache = Path(cache_dir or os.environ.get("DIFFQUANT_CACHE", Path.home() / ".cache" / "diffquant"))
    path = cache / f"tokens-{split}-{info[f'{split}_text_sha256'][:16]}-{tok_hash[:16]}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False), info
    ids = _encode(tokenizer, docs)
    with atomic_path(path) as tmp:
        np.save(tmp, ids, allow_pickle=False)
    return ids, info


def _encode(tokenizer, docs):
    from .data import encode_documents

    log.info("tokenising %d documents (cached afterwards)", len(docs))
    return encode_documents(tokenizer, docs)
