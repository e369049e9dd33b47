"""The outlier-regime protocol (issues 11, 13, 37) on one GPU in calls of at most 9.5 minutes, or on the CPU at
toy sizes.

    python experiments/gpu/run_gpu.py --out experiments/results/gpu/NEXT     # one GPU: ≤ 9.5 min, rerun to go on
    python experiments/gpu/run_gpu.py --dry-run --out /tmp/gpu-dry           # CPU, toy sizes (tested in CI)

``--time-limit S`` scales every phase deadline (default 540 s, leaving ~30 s to start Python and CUDA within 9.5
minutes); ``--lr`` sets the peak learning rate; ``--compile`` wraps each training forward in ``torch.compile``
(opt-in: unmeasured on a GPU, slower on the CPU). Rerunning on the same ``--out`` resumes: the stream's drawn
blocks, the stable runs, the cooled pairs and the sweep records already there are reused, so a plan longer than one
window is worked through call by call.

Steps (each phase has a deadline; the script stops gracefully and evaluates whatever exists):

1. **Data: streamed, never cycled** (``diffquant.stream``). Every run trains on exact ancestral samples of
   stories260K (float64 teacher on the GPU, ``sample_batch`` stories decoded at once) drawn block by block as
   training reaches them; block ``b`` of seed ``S`` comes from a generator seeded by (S, b) alone and is kept in
   ``OUT/stream`` so every run of seed S (both arms, every size, batch 16 and 128, the λ_init 0.8 arm) reads the
   same windows without sampling them again. No corpus phase; no run sees a token twice.
2. **Training**: per group a Transformer and a Diff arm (or, for a λ_init-0.8 group, a constant-λ Diff arm set
   against the group's Transformer, which is the scheduled group's own run) — bf16 autocast, fused AdamW,
   stories260K's recipe (β2 0.99, weight decay 0.01) at batch 128 × 512 unless the group says otherwise, a
   warm-up–stable–decay schedule: the stable run (``OUT/stable/NAME``) trains in chunks, the two arms
   alternately so both always stand at the same step; at each branch point its state is kept (``branches/stepN``)
   and both arms cool down from it for 20 % more steps (``OUT/cooled/NAME-BUDGET``), so one stable run gives
   pairs at several budgets. Outliers are tracked every ``track_every`` steps (``train_log.json``), and each
   finished log carries the memorisation check (fresh − training loss: none by construction, measured). Before
   each chunk and cooldown the guard estimates its time from the throughput measured so far (sampling included)
   and skips what would pass the training deadline; a group with no cooled pair contributes its latest stable
   pair (marked ``stable``).
3. **Verdicts** on every pair, largest budget of each group first, while time lasts: the Table-5 profile
   (all ~100K tokens of the real cased TinyStories held-out text, global protocol; ``table5/PAIR.json.gz``), the
   Figure-8 sweep of the attention logits at 16/8/6/4 bits with the three scale granularities below on that text
   and on the held-out books (``figure8/PAIR.jsonl.gz``), and issue 13's gate per pair: Transformer logit top-1 ≥ 100
   and 4-bit per-sequence logits at least doubling its TinyStories perplexity.
4. **Outputs** under ``--out`` (``diffquant.study.outputs.write_outputs``): ``pairs.json``, ``gate.md`` (with the
   memorisation column), ``table5.md``, ``figure8.md``, ``seeds.md`` / ``seeds.json``, ``trend.md`` /
   ``trend.png``, ``emergence.md`` / ``emergence.json``, ``zeroshot.md`` / ``zeroshot.json`` and
   ``summary.json`` (plan, timings, sampling and training throughput, what the guard skipped).

Granularities: issue 13's three — "sequence" (one scale per sequence; both Diff maps share it), "head" (per
sequence and head) and "head_map" (per head and Diff map). Zero-shot: each size's best-trained pairs are scored
unquantized on ``diffquant.study.zeroshot.ZEROSHOT_TASKS`` and swept only on the tasks where every arm is above chance.

The plan (issue 37), **planned from one H200's measurements** (2026-12-04, ``experiments/results/gpu/2026-12-04-h200``;
only the xs and sampling rates were measured, the others are estimates and the guard keeps each call inside its
limit whatever the real speed):

* Sampling 312K tokens/s (measured: float64 teacher, 4096 stories at once). Streaming pays it once per seed and
  token, shared by every run of that seed, so a window's first ~60M tokens of a new seed cost ~190 s.
* Training at batch 128 × 512, bf16: xs 1.90M (Transformer) / 1.40M (Diff) tokens/s (measured, unfused AdamW;
  fused AdamW now). At this size a step is bound by ~800 kernel launches (34.5 / 46.8 ms per step), not FLOPs, so
  the launch-bound step time is scaled by depth (8 / 5 for s and m, 12 / 5 for l) and set against the FLOP-bound
  time at 250 TFLOP/s (6 N + 12 · layers · 512 · d_model per token): s ≈ 1.2M / 0.87M, m ≈ 1.2M / 0.87M
  (launch-bound still), l ≈ 0.44M / 0.42M tokens/s (FLOP-bound). Batch 16 at xs: the same per-step time at 1/8
  the tokens, ~0.24M / 0.17M tokens/s.
* Order (issue 37, item 3), by seed so each seed's stream is drawn once: seed 0 — m to 30M and 60M (the size
  that should reach the gate inside one window), s, xs, xs with λ_init 0.8 (Diff arm only), and the
  steps-vs-tokens control (xs at batch 16 to the same optimizer steps as the batch-128 pairs: 1/8 the tokens);
  then seeds 1 and 2 the same; then l seed 0 to 30M. One window holds about seed 0's m and xs groups; the rest
  follows call by call.
* Peak learning rate 3e-3 for every size (``--lr`` overrides): at 8× the CPU campaign's batch it is, if
  anything, on the safe side for xs; for m and l it is a guess, and a diverged run is recorded in
  ``summary.json`` and its group stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from diffquant.checkpoint.gguf import stories260k_path
from diffquant.config import ModelConfig
from diffquant.corpus import heldout_ids
from diffquant.emergence import block_means
from diffquant.io import atomic_write_text
from diffquant.records import read_records
from diffquant.stream import TokenStream
from diffquant.study.figure8 import sweep_pair, sweep_path
from diffquant.study.outputs import write_emergence, write_outputs, write_zeroshot
from diffquant.study.pair import tokens_label
from diffquant.study.table5 import profile_pair, profile_path
from diffquant.study.verdict import verdict
from diffquant.study.zeroshot import ZEROSHOT_TASKS, zeroshot_check, zeroshot_path
from diffquant.tokenizer import tokenizer_file_name, tokenizer_for
from diffquant.train import TrainConfig, TrainingDiverged, train

log = logging.getLogger("run_gpu")

ARCHS = ("transformer", "diff")
NO_DECAY = 10**9  # the stable run's decay_start: each cooldown branch sets its own


@dataclass(frozen=True)
class Group:
    """A matched pair trained on one seed; ``budgets``: training tokens of the cooled pairs it yields.
    ``batch_size``: the group's own batch (None: the plan's); ``lambda_init``: a constant λ_init for the Diff
    arm, set against the scheduled group's Transformer (the same run)."""

    preset: str
    seed: int
    budgets: tuple[int, ...]
    batch_size: int | None = None
    lambda_init: float | None = None

    def tag(self, arch: str = "diff") -> str:
        """What sets the group's runs apart from the plain ones: b16 (batch), l0.8 (λ_init; Diff only)."""
        parts = [f"b{self.batch_size}"] if self.batch_size else []
        if self.lambda_init is not None and arch == "diff":
            parts.append(f"l{self.lambda_init:g}")
        return "".join(f"-{p}" for p in parts)

    @property
    def label(self) -> str:
        """The group's name in the verdict files (its "preset": seeds pool within a label, never across)."""
        return self.preset + self.tag()


@dataclass(frozen=True)
class Plan:
    device: str
    bf16: bool
    time_limit_s: float  # the whole call; phase deadlines are fractions of it
    sample_batch: int  # stories the teacher decodes at once
    sample_max_len: int
    block_tokens: int  # tokens per drawn stream block
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    chunk_steps: int  # the guard looks at the clock between chunks
    track_every: int
    eval_tokens: int
    groups: tuple[Group, ...]  # in order of work
    guess_tokens_per_s: dict  # "preset/arch" -> training throughput at batch_size, assumed until one is measured
    guess_sample_tokens_per_s: float  # the teacher's, assumed until measured
    sweep_limits: dict  # perplexity task -> windows (None: all)
    profile_tokens: int | None  # None: the whole held-out text
    eval_batch: int = 32
    zeroshot_tasks: dict = field(default_factory=lambda: dict(ZEROSHOT_TASKS))  # task -> first N items
    cooldown_frac: float = 0.2
    beta2: float = 0.99  # stories260K's recipe
    weight_decay: float = 0.01
    init: str = "normal"
    compile: bool = False
    deadlines: tuple[float, float] = (0.78, 0.97)  # training, evaluation (× time limit)
    threads: int | None = None  # torch CPU threads (None: torch's default)
    block_points: int = 8  # emergence.md averages blocks of this many tracking intervals

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


M = 1_000_000
B16 = 16


def ladder(seed: int, budgets: tuple[int, ...], plan_batch: int) -> tuple[Group, ...]:
    """One seed's groups in order of work: m, s, xs, xs with λ_init 0.8, xs at batch 16 to the same steps."""
    steps_matched = tuple(b * B16 // plan_batch for b in budgets)
    return (Group("m", seed, budgets), Group("s", seed, budgets), Group("xs", seed, budgets),
            Group("xs", seed, budgets, lambda_init=0.8), Group("xs", seed, steps_matched, batch_size=B16))


FULL = Plan(
    device="cuda", bf16=True, time_limit_s=540, sample_batch=4096, sample_max_len=512, block_tokens=1 << 23,
    batch_size=128, seq_len=512, lr=3e-3, warmup_steps=100, chunk_steps=500, track_every=100, eval_tokens=65536,
    groups=(*ladder(0, (30 * M, 60 * M), 128), *ladder(1, (30 * M, 60 * M), 128), *ladder(2, (30 * M, 60 * M), 128),
            Group("l", 0, (30 * M,))),
    guess_tokens_per_s={"xs/transformer": 1.9e6, "xs/diff": 1.4e6, "s/transformer": 1.2e6, "s/diff": 0.87e6,
                        "m/transformer": 1.2e6, "m/diff": 0.87e6, "l/transformer": 0.44e6, "l/diff": 0.42e6},
    guess_sample_tokens_per_s=312e3,
    sweep_limits={"tinystories": None, "test": 200}, profile_tokens=None)
DRY = Plan(
    device="cpu", bf16=False, time_limit_s=600, sample_batch=16, sample_max_len=96, block_tokens=4096,
    batch_size=8, seq_len=64, lr=3e-3, warmup_steps=2, chunk_steps=8, track_every=4, eval_tokens=512,
    groups=(Group("xs", 0, (2048, 4096)), Group("xs", 0, (2048,), lambda_init=0.8),
            Group("xs", 0, (1024,), batch_size=4), Group("xs", 1, (4096,)), Group("s", 0, (2048,)),
            Group("xs", 0, (8192,)), Group("m", 0, (1024,))),
    guess_tokens_per_s={"xs/transformer": 1e4, "xs/diff": 8e3, "s/transformer": 4e3, "s/diff": 3e3,
                        "m/transformer": 2e3, "m/diff": 2e3},
    guess_sample_tokens_per_s=2e3,
    sweep_limits={"tinystories": 1}, profile_tokens=2048, eval_batch=8, zeroshot_tasks={"copa": 8},
    block_points=1,  # the stable xs-s0 run reaches 6,656 tokens (its 8,192 budget branches at 80%): 3 blocks
    threads=1)  # more threads than idle cores makes torch's CPU kernels crawl (100x seen on a busy 2-core box)


# ------------------------------------------------------------------------------------------------ bookkeeping

class Clock:
    """Seconds since the start and what is left before a phase's deadline."""

    def __init__(self, plan: Plan):
        self.start = time.monotonic()
        self.train_until, self.eval_until = (f * plan.time_limit_s for f in plan.deadlines)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, until: float) -> float:
        return until - self.elapsed()


@dataclass
class Data:
    """The teacher's streams (one per seed and batch size; they share ``OUT/stream``) and the validation text."""

    val: np.ndarray
    files: dict
    plan: Plan
    cache: Path
    streams: dict = field(default_factory=dict)

    def stream(self, seed: int, batch_size: int) -> TokenStream:
        key = (seed, batch_size)
        if key not in self.streams:
            self.streams[key] = TokenStream(
                stories260k_path(), seed, batch_size, self.plan.seq_len, max_len=self.plan.sample_max_len,
                draw_batch=self.plan.sample_batch, block_tokens=self.plan.block_tokens, device=self.plan.device,
                cache_dir=self.cache)
        return self.streams[key]

    def sampling(self) -> dict:
        drawn = sum(s.tokens_drawn for s in self.streams.values())
        seconds = sum(s.seconds_drawing for s in self.streams.values())
        return {"tokens_drawn": drawn, "seconds": round(seconds, 1),
                "tokens_per_s": round(drawn / seconds) if seconds else None,
                "blocks_cached": len(list(self.cache.glob("stream-*.npy")))}


@dataclass
class Context:
    plan: Plan
    out: Path
    clock: Clock
    data: Data | None = None
    seconds_per_step: dict = field(default_factory=dict)  # "preset/arch/batch" -> measured, sampling included
    skipped: list = field(default_factory=list)
    diverged: list = field(default_factory=list)
    eval_seconds: dict = field(default_factory=dict)  # preset -> last pair's evaluation time
    zeroshot_seconds: float = 0.0  # the last zero-shot check's time

    def step_seconds(self, run: Run) -> float:
        """Measured seconds per step of the run's kind, or the plan's guess: training plus sampling any block
        not drawn yet (an upper bound: the other arm or another size may have drawn it)."""
        key = f"{run.preset}/{run.arch}/{run.batch_size}"
        train = self.plan.tokens_per_step / self.plan.guess_tokens_per_s[f"{run.preset}/{run.arch}"]
        train *= run.batch_size / self.plan.batch_size if run.batch_size < self.plan.batch_size else 1
        sample = run.batch_size * self.plan.seq_len / self.plan.guess_sample_tokens_per_s
        return self.seconds_per_step.get(key, train + sample)

    def skip(self, what: str) -> None:
        log.warning("time guard: skipping %s", what)
        self.skipped.append({"what": what, "at_s": round(self.clock.elapsed(), 1)})


@dataclass(frozen=True)
class Run:
    """One arm of a group: its stable run folder and its cooled branches."""

    group: Group
    arch: str
    root: Path
    plan_batch: int

    @property
    def preset(self) -> str:
        return self.group.preset

    @property
    def seed(self) -> int:
        return self.group.seed

    @property
    def batch_size(self) -> int:
        return self.group.batch_size or self.plan_batch

    @property
    def name(self) -> str:
        return f"{self.preset}{self.group.tag(self.arch)}-s{self.seed}-{self.arch}"

    @property
    def stable_dir(self) -> Path:
        return self.root / "stable" / self.name

    def cooled_dir(self, budget: int) -> Path:
        return self.root / "cooled" / f"{self.name}-{tokens_label(budget)}"

    def model_config(self) -> ModelConfig:
        lam = {"lambda_init": self.group.lambda_init} if self.arch == "diff" and self.group.lambda_init else {}
        return dataclasses.replace(ModelConfig.preset(self.preset, arch=self.arch), attn_impl="sdpa", **lam)

    def step(self) -> int:
        """The stable run's saved step (0 before its first chunk)."""
        state = self.stable_dir / "state" / "trainer.json"
        return json.loads(state.read_text())["step"] if state.is_file() else 0


def group_runs(group: Group, root: Path, plan: Plan) -> list[Run]:
    return [Run(group, arch, root, plan.batch_size) for arch in ARCHS]


def tokens_per_step(group: Group, plan: Plan) -> int:
    return (group.batch_size or plan.batch_size) * plan.seq_len


def branch_step(budget: int, plan: Plan, group: Group | None = None) -> int:
    """The stable step whose cooldown (cooldown_frac more steps) ends at ``budget`` tokens."""
    per_step = tokens_per_step(group, plan) if group else plan.tokens_per_step
    return max(1, round(budget / per_step / (1 + plan.cooldown_frac)))


def cooldown_steps(step: int, plan: Plan) -> int:
    return max(1, round(plan.cooldown_frac * step))


# ------------------------------------------------------------------------------------------------ 1. data

def load_data(plan: Plan, out: Path) -> Data:
    """The stream factory (teacher stories260K, blocks cached in ``OUT/stream``) and the real cased TinyStories
    text (validation, profiles, gate)."""
    tokenizer = tokenizer_for(stories260k_path())
    files = {tokenizer_file_name(tokenizer): Path(tokenizer.path)}
    return Data(heldout_ids(tokenizer), files, plan, out / "stream")


# ------------------------------------------------------------------------------------------------ 2. training

def train_config(plan: Plan, run: Run, steps: int, decay_start: int = NO_DECAY) -> TrainConfig:
    seed = run.seed
    return TrainConfig(
        tokens=steps * run.batch_size * plan.seq_len, batch_size=run.batch_size, seq_len=plan.seq_len, lr=plan.lr,
        warmup_steps=plan.warmup_steps, schedule="wsd", decay_start=decay_start, beta2=plan.beta2,
        weight_decay=plan.weight_decay, bf16=plan.bf16, device=plan.device, seed=seed, init=plan.init,
        eval_every=plan.chunk_steps, eval_tokens=plan.eval_tokens, save_every=plan.chunk_steps, snapshots=(),
        track_every=plan.track_every, compile=plan.compile)


def timed_train(ctx: Context, run: Run, cfg: TrainConfig, out: Path, steps: int, measure: bool, **kwargs) -> None:
    """train() one stretch; with ``measure`` remember its seconds per step (loading, saving and sampling the
    stream included: stable chunks are long enough for that to be a fair price, short cooldowns are not
    measured)."""
    start = time.perf_counter()
    stream = ctx.data.stream(run.seed, run.batch_size)
    train(run.model_config(), cfg, out, stream, ctx.data.val, provenance={"validation": "tinystories-cased"},
          files=ctx.data.files, **kwargs)
    if measure:
        ctx.seconds_per_step[f"{run.preset}/{run.arch}/{run.batch_size}"] = (time.perf_counter() - start) / steps


def stable_targets(group: Group, plan: Plan, start: int) -> list[int]:
    """Chunk ends from ``start`` to the last branch point: each gap between branch points split evenly."""
    targets, prev = [], start
    for point in sorted(branch_step(b, plan, group) for b in group.budgets):
        if point <= prev:
            continue
        pieces = -(-(point - prev) // plan.chunk_steps)
        targets += [prev + round((point - prev) * (i + 1) / pieces) for i in range(pieces)]
        prev = point
    return targets


def train_stable(ctx: Context, runs: list[Run], target: int) -> bool:
    """Both arms' stable runs to step ``target`` if the guard allows; False when it does not."""
    todo = [(run, target - run.step()) for run in runs if run.step() < target]
    need = sum(ctx.step_seconds(run) * steps for run, steps in todo)
    if need > ctx.clock.left(ctx.clock.train_until):
        ctx.skip(f"{runs[0].group.label}-s{runs[0].seed}: stable steps to {target} (~{need:.0f} s)")
        return False
    for run, steps in todo:
        cfg = train_config(ctx.plan, run, target)
        timed_train(ctx, run, cfg, run.stable_dir, steps, measure=True, resume=run.step() > 0)
    return True


def cool_down(ctx: Context, runs: list[Run], step: int, budget: int) -> dict | None:
    """Keep both arms' states at ``step`` as branches and cool each down from it; the pair, or None (guard)."""
    extra = cooldown_steps(step, ctx.plan)
    for run in runs:
        branch = run.stable_dir / "branches" / f"step{step:06d}"
        if not branch.is_dir():
            shutil.copytree(run.stable_dir / "state", branch)
    todo = [run for run in runs if not (run.cooled_dir(budget) / "final").is_dir()]
    need = sum(ctx.step_seconds(run) * extra for run in todo)
    if need > ctx.clock.left(ctx.clock.train_until):
        ctx.skip(f"{runs[0].group.label}-s{runs[0].seed}: cooldown to {tokens_label(budget)} (~{need:.0f} s)")
        return None
    for run in todo:
        out = run.cooled_dir(budget)
        shutil.rmtree(out, ignore_errors=True)  # an interrupted earlier attempt
        cfg = train_config(ctx.plan, run, step + extra, decay_start=step)
        timed_train(ctx, run, cfg, out, extra, measure=False,
                    branch_from=run.stable_dir / "branches" / f"step{step:06d}")
        shutil.rmtree(out / "state")  # finished: final/ and the log are what the verdicts read
    return cooled_pair(runs, step, budget, ctx.plan)


def cooled_pair(runs: list[Run], step: int, budget: int, plan: Plan) -> dict:
    tokens = (step + cooldown_steps(step, plan)) * runs[0].batch_size * plan.seq_len
    return pair_entry(runs, tokens_label(budget), tokens, {run.arch: run.cooled_dir(budget) for run in runs})


def pair_entry(runs: list[Run], label: str, tokens: int, folders: dict[str, Path]) -> dict:
    preset, seed = runs[0].group.label, runs[0].seed
    return {"pair": f"{preset}-s{seed}-{label}", "preset": preset, "seed": seed, "budget": label, "tokens": tokens,
            "batch_size": runs[0].batch_size,
            "cooled": not label.endswith("stable"),
            "checkpoints": {arch: str(folder / "final") for arch, folder in folders.items()},
            "train_logs": {arch: str(folder / "train_log.json") for arch, folder in folders.items()}}


def train_group(ctx: Context, group: Group) -> list[dict]:
    """The group's stable runs chunk by chunk (arms alternating) with cooldowns at its branch points."""
    runs = group_runs(group, ctx.out, ctx.plan)
    points = {branch_step(b, ctx.plan, group): b for b in group.budgets}
    start = min(run.step() for run in runs)
    pairs = [cooled_pair(runs, step, budget, ctx.plan) for step, budget in sorted(points.items())  # a rerun
             if step <= start and all((run.cooled_dir(budget) / "final").is_dir() for run in runs)]
    try:
        for target in stable_targets(group, ctx.plan, start):
            if not train_stable(ctx, runs, target):
                break
            if target in points and (pair := cool_down(ctx, runs, target, points[target])):
                pairs.append(pair)
    except TrainingDiverged as exc:
        log.error("%s-s%d diverged: %s", group.label, group.seed, exc)
        ctx.diverged.append({"group": f"{group.label}-s{group.seed}", "error": str(exc)})
    if not pairs:
        pairs = latest_stable_pair(runs, ctx.plan)
    return pairs


def latest_stable_pair(runs: list[Run], plan: Plan) -> list[dict]:
    """Both arms' stable checkpoints when they stand at the same step (no cooled pair came out of the group)."""
    steps = {run.step() for run in runs}
    if len(steps) != 1 or 0 in steps or not all((run.stable_dir / "final").is_dir() for run in runs):
        return []
    tokens = steps.pop() * runs[0].batch_size * plan.seq_len
    return [pair_entry(runs, f"{tokens_label(tokens)}-stable", tokens, {run.arch: run.stable_dir for run in runs})]


def train_all(ctx: Context) -> list[dict]:
    pairs = []
    for group in ctx.plan.groups:
        pairs += train_group(ctx, group)
    return pairs


# ------------------------------------------------------------------------------------------------ 3. verdicts

def evaluation_order(pairs: list[dict]) -> list[dict]:
    """Per size, the largest budget every seed reached (the seed comparison and the size trend), then the other
    pairs by budget, largest first."""
    first = []
    for preset in dict.fromkeys(p["preset"] for p in pairs):
        mine = [p for p in pairs if p["preset"] == preset]
        seeds = {p["seed"] for p in mine}
        shared = [p for p in mine if {q["seed"] for q in mine if q["budget"] == p["budget"]} == seeds]
        top = max((p["tokens"] for p in shared), default=None)
        first += [p for p in shared if p["tokens"] == top]
    return first + sorted((p for p in pairs if p not in first), key=lambda p: -p["tokens"])


def evaluate_all(ctx: Context, pairs: list[dict]) -> tuple[list[dict], dict]:
    """Verdicts of the pairs the evaluation deadline allows; also every pair's Table-5 records."""
    results, table5 = [], {}
    for pair in evaluation_order(pairs):
        guess = ctx.eval_seconds.get(pair["preset"], max(ctx.eval_seconds.values(), default=0.0))
        if guess > ctx.clock.left(ctx.clock.eval_until):
            ctx.skip(f"evaluation of {pair['pair']} (~{guess:.0f} s)")
            continue
        start = time.perf_counter()
        plan = ctx.plan
        table5[pair["pair"]] = profile_pair(pair, ctx.data.val, plan.seq_len, plan.eval_batch, plan.profile_tokens,
                                            plan.device, out=profile_path(ctx.out, pair["pair"]))
        records = sweep_pair(pair, sweep_path(ctx.out, pair), plan.sweep_limits, plan.eval_batch, plan.device)
        results.append(verdict(pair, table5[pair["pair"]], records))
        ctx.eval_seconds[pair["preset"]] = time.perf_counter() - start
    return results, table5


def zeroshot_all(ctx: Context, results: list[dict]) -> list[dict]:
    """The zero-shot chance check on each size's best-trained evaluated pairs while time lasts, and Figure 8 on
    the tasks where every arm is above chance (``zeroshot/PAIR.jsonl.gz``)."""
    top = {}
    for r in results:
        top[r["preset"]] = max(top.get(r["preset"], 0), r["tokens"])
    verdicts = []
    for pair in (r for r in results if r["tokens"] == top[r["preset"]]):
        if ctx.zeroshot_seconds > ctx.clock.left(ctx.clock.eval_until):
            ctx.skip(f"zero-shot check of {pair['pair']} (~{ctx.zeroshot_seconds:.0f} s)")
            continue
        start, plan = time.perf_counter(), ctx.plan
        verdicts.append(zeroshot_check(pair, zeroshot_path(ctx.out, pair), plan.zeroshot_tasks, plan.eval_batch,
                                       plan.device))
        ctx.zeroshot_seconds = time.perf_counter() - start
    return verdicts


# ------------------------------------------------------------------------------------------------ 4. outputs

def emergence_blocks(ctx: Context) -> dict[str, list[dict]]:
    """Each group's stable runs: tracked top-1 in blocks of ``block_points`` (emergence.md, the flattening rule)."""
    blocks = {}
    groups: dict[tuple[str, int], Group] = {}
    for g in ctx.plan.groups:  # a run can serve two groups: the first one names it
        groups.setdefault((g.label, g.seed), g)
    for (label, seed), group in groups.items():
        block = ctx.plan.block_points * ctx.plan.track_every * tokens_per_step(group, ctx.plan)
        logs = [run.stable_dir / "train_log.json" for run in group_runs(group, ctx.out, ctx.plan)]
        if all(f.is_file() for f in logs):
            transformer, diff = (json.loads(f.read_text()) for f in logs)
            blocks[f"{label}-s{seed}"] = block_means(transformer, diff, block)
    return blocks


def device_name(plan: Plan) -> str:
    return torch.cuda.get_device_name() if plan.device == "cuda" else "cpu"


def summary(ctx: Context, times: dict, pairs: list[dict], results: list[dict], zeroshot: list[dict]) -> dict:
    per_step = {key: int(key.rsplit("/", 1)[1]) * ctx.plan.seq_len / s for key, s in ctx.seconds_per_step.items()}
    return {"plan": dataclasses.asdict(ctx.plan), "device": device_name(ctx.plan), "times_s": times,
            "sampling": ctx.data.sampling(),
            "train_tokens_per_s_last_stretch": {k: round(v) for k, v in per_step.items()},
            "pairs_trained": [p["pair"] for p in pairs],
            "pairs_evaluated": [r["pair"] for r in results], "gate": {r["pair"]: r["gate"] for r in results},
            "zeroshot_above_chance": {v["pair"]: v["above_chance"] for v in zeroshot},
            "skipped_by_time_guard": ctx.skipped, "diverged": ctx.diverged}


def run(plan: Plan, out: Path) -> dict:
    ctx = Context(plan, out, Clock(plan))
    times = {}
    ctx.data = load_data(plan, out)
    times["setup"] = round(ctx.clock.elapsed(), 1)
    pairs = train_all(ctx)
    times["train"] = round(ctx.clock.elapsed() - times["setup"], 1)
    results, table5 = evaluate_all(ctx, pairs)
    note = "" if results else "No pair was evaluated (see summary.json: what the time guard skipped).\n"
    write_outputs(out, results, table5, note)
    write_emergence(out, emergence_blocks(ctx))
    zeroshot = zeroshot_all(ctx, results)
    write_zeroshot(out, zeroshot, lambda v: read_records(zeroshot_path(out, v)))
    times["evaluate"] = round(ctx.clock.elapsed() - times["setup"] - times["train"], 1)
    times["total"] = round(ctx.clock.elapsed(), 1)
    record = summary(ctx, times, pairs, results, zeroshot)
    atomic_write_text(out / "summary.json", json.dumps(record, indent=1))
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (what CI runs)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run (default: the "
                        "plan's; phase deadlines scale with it)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate of every run")
    parser.add_argument("--compile", action="store_true", help="torch.compile each training forward (opt-in)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    plan = DRY if args.dry_run else FULL
    overrides = {k: v for k, v in (("time_limit_s", args.time_limit), ("lr", args.lr)) if v is not None}
    if args.compile:
        overrides["compile"] = True
    plan = dataclasses.replace(plan, **overrides)
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --dry-run, or on a GPU machine")
    if plan.threads:
        torch.set_num_threads(plan.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = run(plan, out)
    print(json.dumps({k: record[k] for k in ("device", "times_s", "gate", "skipped_by_time_guard")}, indent=1))
    return record


if __name__ == "__main__":
    main()
