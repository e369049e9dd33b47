"""The outlier-regime protocol (issues 11 and 13) on one H200 in at most 12 minutes, or on the CPU at toy sizes.

    python experiments/gpu/run_gpu.py --out experiments/results/gpu            # one H200: ≤ 12 minutes
    python experiments/gpu/run_gpu.py --dry-run --out /tmp/gpu-dry             # CPU, toy sizes (tested in CI)

``--time-limit S`` scales every phase deadline (default 690 s, leaving time to start Python and CUDA within 12
minutes); ``--lr`` sets the peak learning rate. Rerunning on the same ``--out`` resumes: the corpus shards, the
stable runs, the cooled pairs and the sweep records already there are reused.

Steps (each phase has a deadline; the script stops gracefully and evaluates whatever exists):

1. **Teacher corpus**: exact ancestral samples of stories260K (float64 teacher on the GPU, 4096 stories at once),
   shard by shard (``OUT/corpus``), until the planned size or the corpus deadline; the first shard is always drawn.
2. **Training**: matched Transformer/Diff pairs on the corpus — xs with seeds 0, 1, 2, s with seed 0, then xs
   seed 0 extended — bf16 autocast, stories260K's recipe (β2 0.99, weight decay 0.01) at batch 128 × 512, a
   warm-up–stable–decay schedule: the stable run (``OUT/stable/NAME``) trains in chunks, the two arms
   alternately so both always stand at the same step; at each branch point its state is kept
   (``branches/stepN``) and both arms cool down from it for 20 % more steps (``OUT/cooled/NAME-BUDGET``), so
   one stable run gives pairs at several budgets (30M / 100M tokens; 250M for xs seed 0). Outliers are tracked
   every ``track_every`` steps (``train_log.json``). Before each chunk and cooldown the guard estimates its time
   from the throughput measured so far and skips what would pass the training deadline; a pair group with no
   cooled pair then contributes its latest stable pair (marked ``stable``, not cooled).
3. **Verdicts** on every pair, largest budget of each group first, while time lasts: the Table-5 profile
   (all ~100K tokens of the real cased TinyStories held-out text, global protocol; ``table5/PAIR.json``), the
   Figure-8 sweep of the attention logits at 16/8/6/4 bits with the three scale granularities below on
   that text and on the held-out books (``figure8/PAIR.jsonl``), and issue 13's gate per pair: Transformer logit
   top-1 ≥ 100 and 4-bit per-sequence logits at least doubling its TinyStories perplexity.
4. **Outputs** under ``--out`` (``diffquant.regime.write_outputs``): ``pairs.json`` (every pair's numbers),
   ``gate.md``, ``table5.md``, ``figure8.md``, ``seeds.md`` (per-seed Transformer/Diff ratios and 4-bit
   degradation differences, two-sided sign tests, the trend over budgets and sizes; ``seeds.json`` the same as
   records), ``trend.md`` / ``trend.png`` (ratios and 4-bit advantages per budget), ``emergence.md`` /
   ``emergence.json`` (each stable run's tracked outliers in blocks, and whether they have flattened),
   ``zeroshot.md`` / ``zeroshot.json`` (the chance check) and ``summary.json`` (plan, timings, throughput, what
   the guard skipped).

Granularities: issue 13's three — "tensor" (one scale per sequence; both Diff maps share it), "head" (per
sequence and head; both maps of a Diff head share it) and "head_map" (per head and Diff map, which equals the
Transformer's per-head scale). Zero-shot: each size's best-trained pairs are scored unquantized on
``regime.ZEROSHOT_TASKS`` and swept only on the tasks where every arm is above chance (``diffquant.chance``;
``zeroshot.md``, ``zeroshot/PAIR.jsonl``) — on the CPU no 84M-token xs pair was.

Planned sizes (no GPU was available when this was written; every number below is an estimate, and the guard
keeps the script inside 12 minutes whatever the real speed):

* Sampling: per decode step the float64 teacher (260K parameters, 5 layers) runs ~150 small kernels plus two
  host syncs, ~2-3 ms at 4096 rows (the KV cache read is ~2.7 GB at an average length of 256, ~0.8 ms of HBM
  time). A 4096-story batch decodes ≤ 512 steps (~1.3 s) and yields ~1.5M tokens (stories average ~365 tokens):
  ~1M tokens/s. The plan asks 8 shards of 2^24 = 134M tokens (~2 minutes), capped by a 131-second deadline.
  Training then reuses the corpus: ≤ 2 epochs for the longest run (250M), < 1 for the others.
* Training FLOPs are no guide at this size: xs needs ~2.5 MFLOP per token (6N plus attention), 1B tokens only
  2.5 PFLOP, seconds at H200 rates. What bounds it is memory traffic (~135 KB per token for fwd+bwd in bf16 with
  fp32 residuals: ~20M tokens/s at full HBM bandwidth) and per-op launch overhead (~800 kernels per step). At
  128 × 512 = 65K tokens a step, the guess is xs ≈ 4M tokens/s (Transformer) and 3.2M (Diff, more elementwise
  work), s ≈ 1.7M / 1.4M. Budgets: xs pairs to 30M and 100M for three seeds (3 × 2 × 105M tokens ≈ 180 s),
  the s pair to 100M (2 × 105M ≈ 140 s), then xs seed 0 on to 250M (2 × 167M ≈ 95 s): ~1.15B training tokens in
  ~410 s, the training deadline being 538 s after start. The cheapest gated-pair candidates come first, the
  extra seeds before the long run, so a slower machine loses the 250M point, not the seeds.
* Evaluation: profiling 100K tokens and 14 sweep cells of ≤ 100K tokens per checkpoint take seconds on the GPU;
  ~18 checkpoints in ~2 minutes (the evaluation deadline is 669 s after the start).
* Peak learning rate 3e-3: in part 1's sweep (xs, batch 16 × 512, still running when this was written) the
  Transformer's logit top-1 grew faster at 3e-3 than at 1e-3; at 8× that batch 3e-3 is, if anything, on the
  safe side. The s preset stays at 3e-3 too: on the CPU (batch 16) its Transformer did not gate at 3e-3 (logit
  top-1 ~58 to 41M tokens) nor at 6e-3 (60-75 to 11M), and at 6e-3 and 1e-2 Diff's logits ran away (525 and
  1,947 by 4.2M tokens) with its λ sinking towards 0 (6e-3) or below it (1e-2; RESULTS.md, run 3), so a higher
  rate for s buys a broken Diff, not a gated pair. A diverged run is recorded in ``summary.json`` and its group
  stops; ``--lr`` overrides the value.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from diffquant.checkpoint.gguf import stories260k_path
from diffquant.config import ModelConfig
from diffquant.corpus import heldout_ids, load_corpus
from diffquant.emergence import block_means
from diffquant.io import atomic_write_text
from diffquant.records import read_records
from diffquant.regime import (
    ZEROSHOT_TASKS,
    profile_pair,
    sweep_pair,
    sweep_path,
    tokens_label,
    verdict,
    write_emergence,
    write_outputs,
    write_zeroshot,
    zeroshot_check,
)
from diffquant.sample import sample_corpus
from diffquant.tokenizer import Tokenizer
from diffquant.train import TrainConfig, TrainingDiverged, train

log = logging.getLogger("run_gpu")

ARCHS = ("transformer", "diff")
NO_DECAY = 10**9  # the stable run's decay_start: each cooldown branch sets its own


@dataclass(frozen=True)
class Group:
    """A matched pair trained on one seed; ``budgets``: training tokens of the cooled pairs it yields."""

    preset: str
    seed: int
    budgets: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    device: str
    bf16: bool
    time_limit_s: float  # the whole script; phase deadlines are fractions of it
    corpus_tokens: int
    shard_tokens: int
    sample_batch: int
    sample_max_len: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    chunk_steps: int  # the guard looks at the clock between chunks
    track_every: int
    eval_tokens: int
    groups: tuple[Group, ...]  # in order of work
    guess_tokens_per_s: dict  # "preset/arch" -> throughput assumed until one is measured
    sweep_limits: dict  # perplexity task -> windows (None: all)
    profile_tokens: int | None  # None: the whole held-out text
    eval_batch: int = 32
    zeroshot_tasks: dict = field(default_factory=lambda: dict(ZEROSHOT_TASKS))  # task -> first N items
    cooldown_frac: float = 0.2
    beta2: float = 0.99  # stories260K's recipe
    weight_decay: float = 0.01
    init: str = "normal"
    corpus_seed: int = 0
    deadlines: tuple[float, float, float] = (0.19, 0.78, 0.97)  # corpus, training, evaluation (× time limit)
    threads: int | None = None  # torch CPU threads (None: torch's default)
    block_points: int = 8  # emergence.md averages blocks of this many tracking intervals

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


M = 1_000_000
FULL = Plan(
    device="cuda", bf16=True, time_limit_s=690, corpus_tokens=8 << 24, shard_tokens=1 << 24, sample_batch=4096,
    sample_max_len=512, batch_size=128, seq_len=512, lr=3e-3, warmup_steps=100, chunk_steps=500, track_every=100,
    eval_tokens=65536,
    groups=(Group("xs", 0, (30 * M, 100 * M)), Group("xs", 1, (30 * M, 100 * M)), Group("xs", 2, (30 * M, 100 * M)),
            Group("s", 0, (30 * M, 100 * M)), Group("xs", 0, (250 * M,))),
    guess_tokens_per_s={"xs/transformer": 4.0e6, "xs/diff": 3.2e6, "s/transformer": 1.7e6, "s/diff": 1.4e6},
    sweep_limits={"tinystories": None, "test": 200}, profile_tokens=None)
DRY = Plan(
    device="cpu", bf16=False, time_limit_s=600, corpus_tokens=3 * 4096, shard_tokens=4096, sample_batch=32,
    sample_max_len=128, batch_size=4, seq_len=64, lr=3e-3, warmup_steps=2, chunk_steps=8, track_every=4,
    eval_tokens=512,
    groups=(Group("xs", 0, (2048, 4096)), Group("xs", 1, (4096,)), Group("s", 0, (2048,)), Group("xs", 0, (8192,))),
    guess_tokens_per_s={"xs/transformer": 1e4, "xs/diff": 8e3, "s/transformer": 4e3, "s/diff": 3e3},
    sweep_limits={"tinystories": 1}, profile_tokens=2048, eval_batch=8, zeroshot_tasks={"copa": 8},
    block_points=2,
    threads=1)  # more threads than idle cores makes torch's CPU kernels crawl (100x seen on a busy 2-core box)


# ------------------------------------------------------------------------------------------------ bookkeeping

class Clock:
    """Seconds since the start and what is left before a phase's deadline."""

    def __init__(self, plan: Plan):
        self.start = time.monotonic()
        self.corpus_until, self.train_until, self.eval_until = (f * plan.time_limit_s for f in plan.deadlines)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, until: float) -> float:
        return until - self.elapsed()


@dataclass
class Data:
    train: np.ndarray
    val: np.ndarray
    files: dict
    provenance: dict


@dataclass
class Context:
    plan: Plan
    out: Path
    clock: Clock
    data: Data | None = None
    seconds_per_step: dict = field(default_factory=dict)  # "preset/arch" -> measured, overhead included
    skipped: list = field(default_factory=list)
    diverged: list = field(default_factory=list)
    eval_seconds: dict = field(default_factory=dict)  # preset -> last pair's evaluation time
    zeroshot_seconds: float = 0.0  # the last zero-shot check's time

    def step_seconds(self, run: Run) -> float:
        key = f"{run.preset}/{run.arch}"
        guess = self.plan.tokens_per_step / self.plan.guess_tokens_per_s[key]
        return self.seconds_per_step.get(key, guess)

    def skip(self, what: str) -> None:
        log.warning("time guard: skipping %s", what)
        self.skipped.append({"what": what, "at_s": round(self.clock.elapsed(), 1)})


@dataclass(frozen=True)
class Run:
    """One arm of a group: its stable run folder and its cooled branches."""

    preset: str
    seed: int
    arch: str
    root: Path

    @property
    def name(self) -> str:
        return f"{self.preset}-s{self.seed}-{self.arch}"

    @property
    def stable_dir(self) -> Path:
        return self.root / "stable" / self.name

    def cooled_dir(self, budget: int) -> Path:
        return self.root / "cooled" / f"{self.name}-{tokens_label(budget)}"

    def model_config(self) -> ModelConfig:
        return dataclasses.replace(ModelConfig.preset(self.preset, arch=self.arch), attn_impl="sdpa")

    def step(self) -> int:
        """The stable run's saved step (0 before its first chunk)."""
        state = self.stable_dir / "state" / "trainer.json"
        return json.loads(state.read_text())["step"] if state.is_file() else 0


def branch_step(budget: int, plan: Plan) -> int:
    """The stable step whose cooldown (cooldown_frac more steps) ends at ``budget`` tokens."""
    return max(1, round(budget / plan.tokens_per_step / (1 + plan.cooldown_frac)))


def cooldown_steps(step: int, plan: Plan) -> int:
    return max(1, round(plan.cooldown_frac * step))


# ------------------------------------------------------------------------------------------------ 1. corpus

def draw_corpus(ctx: Context) -> dict:
    """Shard by shard until the planned size or the corpus deadline (at least one shard)."""
    plan, folder = ctx.plan, ctx.out / "corpus"
    n_shards = -(-plan.corpus_tokens // plan.shard_tokens)
    manifest: dict = {}
    for n in range(1, n_shards + 1):
        if manifest and manifest["shards"][-1]["seconds"] > ctx.clock.left(ctx.clock.corpus_until):
            ctx.skip(f"corpus shards {n - 1}..{n_shards - 1}")
            break
        manifest = sample_corpus(stories260k_path(), folder, tokens=n * plan.shard_tokens, seed=plan.corpus_seed,
                                 batch_size=plan.sample_batch, max_len=plan.sample_max_len,
                                 shard_tokens=plan.shard_tokens, command=" ".join(["python", *sys.argv]),
                                 progress=False, device=plan.device)
    return manifest


def load_data(folder: Path) -> Data:
    """The corpus (training) and the real cased TinyStories text (validation, profiles, gate)."""
    corpus = load_corpus(folder, vocab_size=ModelConfig.preset("xs").vocab_size)
    tokenizer = Tokenizer.load(corpus.tokenizer_path)
    provenance = {"corpus": str(folder), "corpus_tokens": int(corpus.ids.size),
                  "corpus_shards_sha256": [s["sha256"] for s in corpus.manifest["shards"]],
                  "teacher_sha256": corpus.manifest.get("teacher_sha256"), "validation": "tinystories-cased"}
    return Data(corpus.ids, heldout_ids(tokenizer), {corpus.tokenizer_path.name: corpus.tokenizer_path}, provenance)


# ------------------------------------------------------------------------------------------------ 2. training

def train_config(plan: Plan, seed: int, steps: int, decay_start: int = NO_DECAY) -> TrainConfig:
    return TrainConfig(
        tokens=steps * plan.tokens_per_step, batch_size=plan.batch_size, seq_len=plan.seq_len, lr=plan.lr,
        warmup_steps=plan.warmup_steps, schedule="wsd", decay_start=decay_start, beta2=plan.beta2,
        weight_decay=plan.weight_decay, bf16=plan.bf16, device=plan.device, seed=seed, init=plan.init,
        eval_every=plan.chunk_steps, eval_tokens=plan.eval_tokens, save_every=plan.chunk_steps, snapshots=(),
        track_every=plan.track_every)


def timed_train(ctx: Context, run: Run, cfg: TrainConfig, out: Path, steps: int, measure: bool, **kwargs) -> None:
    """train() one stretch; with ``measure`` remember its seconds per step (loading and saving included: stable
    chunks are long enough for that to be a fair price, short cooldowns are not measured)."""
    start = time.perf_counter()
    train(run.model_config(), cfg, out, ctx.data.train, ctx.data.val, provenance=ctx.data.provenance,
          files=ctx.data.files, **kwargs)
    if measure:
        ctx.seconds_per_step[f"{run.preset}/{run.arch}"] = (time.perf_counter() - start) / steps


def stable_targets(group: Group, plan: Plan, start: int) -> list[int]:
    """Chunk ends from ``start`` to the last branch point: each gap between branch points split evenly."""
    targets, prev = [], start
    for point in sorted(branch_step(b, plan) for b in group.budgets):
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
        ctx.skip(f"{runs[0].preset}-s{runs[0].seed}: stable steps to {target} (~{need:.0f} s)")
        return False
    for run, steps in todo:
        cfg = train_config(ctx.plan, run.seed, target)
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
        ctx.skip(f"{runs[0].preset}-s{runs[0].seed}: cooldown to {tokens_label(budget)} (~{need:.0f} s)")
        return None
    for run in todo:
        out = run.cooled_dir(budget)
        shutil.rmtree(out, ignore_errors=True)  # an interrupted earlier attempt
        cfg = train_config(ctx.plan, run.seed, step + extra, decay_start=step)
        timed_train(ctx, run, cfg, out, extra, measure=False,
                    branch_from=run.stable_dir / "branches" / f"step{step:06d}")
        shutil.rmtree(out / "state")  # finished: final/ and the log are what the verdicts read
    return cooled_pair(runs, step, budget, ctx.plan)


def cooled_pair(runs: list[Run], step: int, budget: int, plan: Plan) -> dict:
    tokens = (step + cooldown_steps(step, plan)) * plan.tokens_per_step
    return pair_entry(runs, tokens_label(budget), tokens, {run.arch: run.cooled_dir(budget) for run in runs})


def pair_entry(runs: list[Run], label: str, tokens: int, folders: dict[str, Path]) -> dict:
    preset, seed = runs[0].preset, runs[0].seed
    return {"pair": f"{preset}-s{seed}-{label}", "preset": preset, "seed": seed, "budget": label, "tokens": tokens,
            "cooled": not label.endswith("stable"),
            "checkpoints": {arch: str(folder / "final") for arch, folder in folders.items()},
            "train_logs": {arch: str(folder / "train_log.json") for arch, folder in folders.items()}}


def train_group(ctx: Context, group: Group) -> list[dict]:
    """The group's stable runs chunk by chunk (arms alternating) with cooldowns at its branch points."""
    runs = [Run(group.preset, group.seed, arch, ctx.out) for arch in ARCHS]
    points = {branch_step(b, ctx.plan): b for b in group.budgets}
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
        log.error("%s-s%d diverged: %s", group.preset, group.seed, exc)
        ctx.diverged.append({"group": f"{group.preset}-s{group.seed}", "error": str(exc)})
    if not pairs:
        pairs = latest_stable_pair(runs, ctx.plan)
    return pairs


def latest_stable_pair(runs: list[Run], plan: Plan) -> list[dict]:
    """Both arms' stable checkpoints when they stand at the same step (no cooled pair came out of the group)."""
    steps = {run.step() for run in runs}
    if len(steps) != 1 or 0 in steps or not all((run.stable_dir / "final").is_dir() for run in runs):
        return []
    tokens = steps.pop() * plan.tokens_per_step
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
                                            plan.device, out=ctx.out / "table5" / f"{pair['pair']}.json")
        records = sweep_pair(pair, sweep_path(ctx.out, pair), plan.sweep_limits, plan.eval_batch, plan.device)
        results.append(verdict(pair, table5[pair["pair"]], records))
        ctx.eval_seconds[pair["preset"]] = time.perf_counter() - start
    return results, table5


def zeroshot_all(ctx: Context, results: list[dict]) -> list[dict]:
    """The zero-shot chance check on each size's best-trained evaluated pairs while time lasts, and Figure 8 on
    the tasks where every arm is above chance (``zeroshot/PAIR.jsonl``)."""
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


def zeroshot_path(out: Path, pair: dict) -> Path:
    return out / "zeroshot" / f"{pair['pair']}.jsonl"


# ------------------------------------------------------------------------------------------------ 4. outputs

def emergence_blocks(ctx: Context) -> dict[str, list[dict]]:
    """Each group's stable runs: tracked top-1 in blocks of ``block_points`` (emergence.md, the flattening rule)."""
    block = ctx.plan.block_points * ctx.plan.track_every * ctx.plan.tokens_per_step
    blocks = {}
    for preset, seed in dict.fromkeys((g.preset, g.seed) for g in ctx.plan.groups):  # a run can serve two groups
        logs = [Run(preset, seed, arch, ctx.out).stable_dir / "train_log.json" for arch in ARCHS]
        if all(f.is_file() for f in logs):
            transformer, diff = (json.loads(f.read_text()) for f in logs)
            blocks[f"{preset}-s{seed}"] = block_means(transformer, diff, block)
    return blocks


def device_name(plan: Plan) -> str:
    return torch.cuda.get_device_name() if plan.device == "cuda" else "cpu"


def summary(ctx: Context, times: dict, manifest: dict, pairs: list[dict], results: list[dict],
            zeroshot: list[dict]) -> dict:
    tokens_per_s = {key: round(ctx.plan.tokens_per_step / s) for key, s in ctx.seconds_per_step.items()}
    return {"plan": dataclasses.asdict(ctx.plan), "device": device_name(ctx.plan), "times_s": times,
            "corpus": {"tokens": manifest.get("tokens"), "shards": len(manifest.get("shards", [])),
                       "tokens_per_s": [s["tokens_per_s"] for s in manifest.get("shards", [])]},
            "train_tokens_per_s_last_stretch": tokens_per_s, "pairs_trained": [p["pair"] for p in pairs],
            "pairs_evaluated": [r["pair"] for r in results], "gate": {r["pair"]: r["gate"] for r in results},
            "zeroshot_above_chance": {v["pair"]: v["above_chance"] for v in zeroshot},
            "skipped_by_time_guard": ctx.skipped, "diverged": ctx.diverged}


def run(plan: Plan, out: Path) -> dict:
    ctx = Context(plan, out, Clock(plan))
    times = {}
    manifest = draw_corpus(ctx)
    ctx.data = load_data(out / "corpus")
    times["corpus"] = round(ctx.clock.elapsed(), 1)
    pairs = train_all(ctx)
    times["train"] = round(ctx.clock.elapsed() - times["corpus"], 1)
    results, table5 = evaluate_all(ctx, pairs)
    note = "" if results else "No pair was evaluated (see summary.json: what the time guard skipped).\n"
    write_outputs(out, results, table5, note)
    write_emergence(out, emergence_blocks(ctx))
    zeroshot = zeroshot_all(ctx, results)
    write_zeroshot(out, zeroshot, lambda v: read_records(zeroshot_path(out, v)))
    times["evaluate"] = round(ctx.clock.elapsed() - times["corpus"] - times["train"], 1)
    times["total"] = round(ctx.clock.elapsed(), 1)
    record = summary(ctx, times, manifest, pairs, results, zeroshot)
    atomic_write_text(out / "summary.json", json.dumps(record, indent=1))
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (what CI runs)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run (default: the "
                        "plan's; phase deadlines scale with it)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate of every run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    plan = DRY if args.dry_run else FULL
    overrides = {k: v for k, v in (("time_limit_s", args.time_limit), ("lr", args.lr)) if v is not None}
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
