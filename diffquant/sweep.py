"""Degradation sweeps: every checkpoint × bit width × task, one JSON record each, appended to a JSONL file.

A sweep quantizes one *target* at the given bit widths and scores each result on each task:

* targets: ``attn_logits``, ``attn_probs``, ``qk`` (``attn_q`` and ``attn_k``), ``hidden`` (dynamic absmax at
  the probes of those kinds; ``probs``, the old name of ``attn_probs``, is still read), ``linear_inputs``
  (the inputs of the blocks' Linear layers), ``weights-<method>`` for each registered weight method that sweeps
  over bit widths (``weights-rtn``, ``weights-gptq``, ``weights-hadamard-rtn``: the blocks' Linear weights);
* 16 bits is the unquantized model (the paper's convention), for weight targets too. It belongs to no
  target, so one baseline record per checkpoint and task serves every target swept into the same file;
* tasks: perplexity on ``wikitext2`` (WikiText-2 test), ``test`` / ``validation`` (the held-out books),
  ``tinystories`` (the cased sample), any calib source name or a text file; zero-shot multiple choice on the
  tasks of :mod:`diffquant.tasks` (``hellaswag``, ``copa``, ...), or ``TASK:PATH`` for another file in that
  task's format;
* ``limit``: N items (multiple choice) or N rolling windows (perplexity; each window is ``max_seq_len`` tokens,
  lm-eval's disjoint windows): the first N, as lm-eval's ``--limit``, or with ``subset="random"`` a fixed seeded
  subset; the same for every model and bit width. Records say which (``subset``: first | random | null).

Records (one JSON object per line) hold the metrics with their per-item / per-window results (for the paired
statistics of :mod:`diffquant.report`), the quantization config, the settings, the model config and versions.
The file is resumable: a cell whose :func:`~diffquant.records.record_key` is already there is skipped; each
checkpoint is loaded once and its float model is scored once per task. Each line is written in one call and
flushed, so an interruption loses at most the record in progress (a cut-off last line is removed on resume).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import distributed
from .calibration import DEFAULT_CALIB_TOKENS, calibration_batch
from .checkpoint import QUANTIZED_FORMATS, checkpoint_format, load_checkpoint, read_model_config
from .config import ATTN_IMPLS as MODEL_ATTN_IMPLS
from .data import SOURCES, data_fingerprint, documents
from .evaluate import (
    evaluate_task,
    finite_metrics,
    model_max_len,
    perplexity_metrics,
)
from .hf_native import check_native, is_native_hf, load_probed_hf
from .io import check_output, locked_append
from .kinds import SEQUENCE, canonical_granularity
from .memory import check_fits, forward_bytes
from .progress import progress_bar
from .quant import ActQuant, QuantConfig, WeightQuant, quantize, weight_method, weight_methods
from .quant.config import ACT_TARGETS
from .records import (
    BASELINE_BITS,
    SCHEMA,
    append_record,
    canonical_target,
    checkpoint_label,
    checkpoint_sha256,
    read_records,
    record_key,
    repair_tail,
    versions,
)
from .tasks import SUBSETS, TASKS, canonical_task, load_task
from .tokenizer import tokenizer_for

log = logging.getLogger(__name__)

# target -> the QuantConfig field it sets (ACT_TARGETS, quant/config.py) or the weight method
WEIGHT_TARGETS = {f"weights-{m}": m for m in weight_methods() if weight_method(m).sweepable}
AS_STORED = "none"  # score the model as stored (a packed, compressed-tensors or GGUF Q8_0/Q4_0 model): 16 only
TARGETS = (*ACT_TARGETS, *WEIGHT_TARGETS, AS_STORED)

PERPLEXITY_TASKS = {"wikitext2": "wikitext2-test", "test": "test", "validation": "validation",
                    "tinystories": "tinystories-cased"}
ATTN_IMPLS = tuple(i for i in MODEL_ATTN_IMPLS if i != "flash")  # flash is GPU-only and needs CUDA


# ---------------------------------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Scheme:
    """What is quantized and how, apart from the bit width."""

    target: str
    granularity: str | None = None  # activation targets
    group_size: int | None = None  # weight targets
    calib_tokens: int | None = None  # methods that need calibration (GPTQ)

    @property
    def needs_calibration(self) -> bool:
        return self.target in WEIGHT_TARGETS and weight_method(WEIGHT_TARGETS[self.target]).needs_calibration

    def config(self, bits: int) -> QuantConfig:
        """The QuantConfig at ``bits`` (16 = the unquantized model: an empty config; as stored: always)."""
        if bits == BASELINE_BITS or self.target == AS_STORED:
            return QuantConfig()
        if self.target in WEIGHT_TARGETS:
            return QuantConfig(weights=WeightQuant(WEIGHT_TARGETS[self.target], bits, self.group_size))
        return QuantConfig(**{ACT_TARGETS[self.target]: ActQuant(bits, self.granularity)})

    def fields(self, bits: int) -> dict:
        """The record fields that name the scheme; all None at 16 bits (the baseline of every scheme)."""
        if bits == BASELINE_BITS:
            return {"target": None, "granularity": None, "group_size": None, "calib_tokens": None}
        return {"target": self.target, "granularity": self.granularity, "group_size": self.group_size,
                "calib_tokens": self.calib_tokens}


def make_scheme(target: str, granularity: str | None = None, group_size: int | None = None,
                calib_tokens: int | None = None) -> Scheme:
    target = canonical_target(target)
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if target == AS_STORED:
        if granularity is not None or group_size is not None or calib_tokens is not None:
            raise ValueError("--target none scores the model as stored: it takes no --granularity, --group-size "
                             "or --calib-tokens")
        return Scheme(target)
    if target in WEIGHT_TARGETS:
        if granularity is not None:
            raise ValueError("--granularity applies to activation targets; weight targets take --group-size")
        if weight_method(WEIGHT_TARGETS[target]).needs_calibration:
            calib_tokens = DEFAULT_CALIB_TOKENS if calib_tokens is None else calib_tokens
            _positive("calib_tokens", calib_tokens)
        else:
            calib_tokens = None
        if group_size is not None:
            _positive("group_size", group_size)
        scheme = Scheme(target, None, group_size, calib_tokens)
    else:
        if group_size is not None:
            raise ValueError("--group-size applies to weight targets only")
        scheme = Scheme(target, canonical_granularity(granularity) or SEQUENCE)  # records say "sequence"
    scheme.config(4)  # the quantizer's own checks (granularity names, 'head' on hidden states, ...)
    return scheme


def check_bits(scheme: Scheme, bits: Sequence[int]) -> list[int]:
    """The bit widths, 16 first and without repeats; each is checked by building its config."""
    if not bits:
        raise ValueError("no bit widths to sweep")
    if scheme.target == AS_STORED and list(bits) != [BASELINE_BITS]:
        raise ValueError(f"--target none scores the model as stored: --bits {BASELINE_BITS} only")
    top = 8 if scheme.target in WEIGHT_TARGETS else 15
    for b in bits:
        if isinstance(b, bool) or not isinstance(b, int) or not (2 <= b <= top or b == BASELINE_BITS):
            raise ValueError(f"bits must be 16 (unquantized) or an integer in 2..{top} for {scheme.target}, "
                             f"got {b!r}")
        scheme.config(b)  # raises a one-line ValueError for combinations the quantizer refuses
    order = list(dict.fromkeys(bits))
    return sorted(order, key=lambda b: b != BASELINE_BITS)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Task:
    """A resolved task: ``name`` goes into the records; ``source`` is a documents() spec or an item file."""

    name: str
    kind: str  # "perplexity" | "multiple_choice" | "lambada"
    source: str | None = None


def resolve_task(name: str) -> Task:
    """A perplexity set (named or a file), a zero-shot task, or ``TASK:PATH`` (a file in TASK's format)."""
    name = name.strip()
    if name in PERPLEXITY_TASKS:
        return Task(name, "perplexity", PERPLEXITY_TASKS[name])
    if name in SOURCES:
        return Task(name, "perplexity", name)
    try:
        key = canonical_task(name)
        return Task(key, TASKS[key].kind)
    except ValueError:
        pass
    head, sep, path = name.partition(":")
    if sep and head.strip().lower() and path:
        try:
            key = canonical_task(head)
        except ValueError:
            key = None
        if key is not None:
            return Task(f"{key}:{path}", TASKS[key].kind, path)
    if Path(name).is_file():
        return Task(os.path.normpath(name), "perplexity", name)
    known = [*PERPLEXITY_TASKS, *TASKS]
    raise ValueError(f"unknown task {name!r}; choose one of {', '.join(known)}, a calib source, a text file, "
                     "or TASK:PATH")


def _task_data(task: Task, limit: int | None, seed: int, subset: str = "first"):
    """Documents of a perplexity task; for zero-shot tasks the items are loaded once to fail early."""
    if task.kind == "perplexity":
        return documents(task.source)
    return load_task(task.name.partition(":")[0], limit=limit, seed=seed, path=task.source, subset=subset)


# ---------------------------------------------------------------------------------------------------- scoring

def evaluate_cell(model, tokenizer, task: Task, data, limit: int | None, seed: int, batch_size: int,
                  progress: bool = True, subset: str = "first") -> dict:
    """The metrics of one (model, task) cell."""
    if task.kind == "perplexity":
        return perplexity_metrics(model, tokenizer, data, limit, seed, batch_size, progress, subset)
    return evaluate_task(model, tokenizer, task.name.partition(":")[0], limit=limit, seed=seed,
                         batch_size=batch_size, progress=progress, path=task.source, subset=subset)


# ---------------------------------------------------------------------------------------------------- records

# ---------------------------------------------------------------------------------------------------- the sweep

@dataclass
class _Checkpoint:
    path: str
    sha256: str
    cells: list[tuple[int, Task]]  # still to do


def run_sweep(checkpoints: Sequence[str | os.PathLike], out: str | os.PathLike, target: str,
              bits: Sequence[int] = (16, 8, 6, 4), tasks: Sequence[str] = ("wikitext2",),
              granularity: str | None = None, group_size: int | None = None, limit: int | None = None,
              seed: int = 0, batch_size: int = 8, calib_tokens: int | None = None, calib_data: str = "train",
              attn_impl: str = "eager", device: str = "cpu", progress: bool = True, subset: str = "first",
              dispatch: dict | None = None, tokenizer: str | os.PathLike | None = None) -> dict:
    """Score every checkpoint × bits × task not yet in ``out``; returns ``{"out", "written", "nonfinite",
    "skipped"}``.

    Everything is checked before the first model is loaded (:func:`check_sweep`). One sweep writes ``out`` at a
    time (a lock); the cells already in it are read under the lock and skipped. NaN/Inf losses are recorded as
    null metrics with a ``nonfinite`` count. ``dispatch``: :func:`~diffquant.offload.load_dispatched` options
    (``device_map``, ``max_memory``, ``offload_folder``) for HF folders larger than one device. ``tokenizer``:
    a tokenizer file for every checkpoint (default: each one's own, :func:`~diffquant.tokenizer.tokenizer_for`).
    """
    scheme = make_scheme(target, granularity, group_size, calib_tokens)
    bits = check_bits(scheme, bits)
    resolved = list({t.name: t for t in map(resolve_task, tasks)}.values())
    checkpoints = list(dict.fromkeys(os.path.normpath(str(c)) for c in checkpoints))
    check_sweep(scheme, checkpoints, resolved, limit, batch_size, attn_impl, calib_data, subset)
    if not dispatch:  # a dispatched model spreads over devices: accelerate's max_memory governs it
        _check_memory(checkpoints, resolved, limit, batch_size, device)
    for ckpt in checkpoints:  # a model without a tokenizer that fits it is refused before any work
        tokenizer_for(ckpt, tokenizer)
    subset = subset if limit is not None else None  # records: which items --limit kept (none without it)
    out = check_output(out, flag="--out")
    read_records(out, missing_ok=True)  # an existing --out must be a records file before anything touches it
    data = {t.name: _task_data(t, limit, seed, subset) for t in resolved}
    total = len(checkpoints) * len(bits) * len(resolved)
    settings = {"limit": limit, "subset": subset, "seed": seed, "attn_impl": attn_impl, "batch_size": batch_size,
                "device": device}
    settings["dispatch"] = dispatch  # how to load, not part of a record
    settings["tokenizer"] = tokenizer
    counts = {"written": 0, "nonfinite": 0}
    progress = progress and distributed.is_main()
    with _records_file(out) as fh:
        todo = distributed.on_main(lambda: _read_plan(out, checkpoints, scheme, bits, resolved, settings))
        done = total - sum(len(c.cells) for c in todo)  # as initial, not an update: the ETA counts cells scored now
        with progress_bar(total=total, initial=done, desc="sweep", unit="cell", disable=not progress) as bar:
            for ckpt in todo:
                if ckpt.cells:
                    _sweep_checkpoint(ckpt, scheme, data, settings, calib_data, fh, bar, progress, counts)
    log.info("%s: %d records written, %d already there", out, counts["written"], total - counts["written"])
    return {"out": str(out), **counts, "skipped": total - counts["written"]}


@contextmanager
def _records_file(out: Path):
    """The locked records file on rank 0; None on the other ranks of a data-parallel sweep (they only score)."""
    if not distributed.is_main():
        yield None
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked_append(out) as fh:
        yield fh


def _read_plan(out: Path, checkpoints: list[str], scheme: Scheme, bits: list[int], tasks: list[Task],
               settings: dict) -> list[_Checkpoint]:
    existing = read_records(out, missing_ok=True)  # read under the lock: no cell is computed twice
    repair_tail(out)  # only after the file was read as records
    return [_plan(ckpt, existing, scheme, bits, tasks, settings) for ckpt in checkpoints]


def check_sweep(scheme: Scheme, checkpoints: list[str], tasks: list[Task], limit: int | None, batch_size: int,
                attn_impl: str, calib_data: str, subset: str = "first") -> None:
    """The settings, tasks, checkpoints (exist, float, admit the group size) and calibration data; the task
    data and the records file (no records of a different checkpoint at the same path) are checked next."""
    if limit is not None:
        _positive("limit", limit)
    if subset not in SUBSETS:
        raise ValueError(f"unknown subset {subset!r}; choose one of {', '.join(SUBSETS)}")
    _positive("batch_size", batch_size)
    if attn_impl not in ATTN_IMPLS:
        raise ValueError(f"unknown attn_impl {attn_impl!r}; choose one of {', '.join(ATTN_IMPLS)}")
    if not tasks:
        raise ValueError("no tasks given")
    for ckpt in checkpoints:
        check_checkpoint(ckpt, scheme)
    if scheme.needs_calibration and calib_data != "train":  # the train split ships with the package
        documents(calib_data)  # exists and is readable


def _check_memory(checkpoints: list[str], tasks: list[Task], limit: int | None, batch_size: int,
                  device: str) -> None:
    """A perplexity batch holds ``batch_size`` windows of the context's length: their logits must fit."""
    if not any(t.kind == "perplexity" for t in tasks):
        return
    batch = min(batch_size, limit) if limit else batch_size
    for ckpt in checkpoints:
        if not is_native_hf(ckpt):
            cfg = read_model_config(ckpt)
            check_fits(forward_bytes(cfg, batch, cfg.max_seq_len), device,
                       f"scoring {batch} windows of {cfg.max_seq_len} tokens at once ({ckpt})", "lower --batch-size")


def check_checkpoint(path: str, scheme: Scheme) -> None:
    """A float checkpoint whose config admits the scheme, read without loading a model."""
    if checkpoint_format(path) in QUANTIZED_FORMATS and scheme.target != AS_STORED:
        raise ValueError(f"{path} is already quantized: score it as stored with --target none, or sweep its float "
                         "checkpoint")
    if is_native_hf(path):  # any other HF causal LM: quantized through HFProbed
        check_native(path, scheme.config(4).probe_targets())
        return
    read_model_config(path)


def _plan(path: str, existing: list[dict], scheme: Scheme, bits: list[int], tasks: list[Task],
          settings: dict) -> _Checkpoint:
    """The cells of one checkpoint that ``existing`` lacks (after checking it is the same checkpoint)."""
    sha = checkpoint_sha256(path)
    mine = _records_of(path, existing)
    other = {r.get("checkpoint_sha256") for r in mine} - {sha}
    if other:
        raise ValueError(f"the records file holds results of a different checkpoint at {path} "
                         "(its files changed): write to a new --out")
    return _Checkpoint(path, sha, _cells_missing(path, mine, scheme, bits, tasks, settings))


def _records_of(path: str, existing: list[dict]) -> list[dict]:
    """The records of the checkpoint at ``path``: absolute, relative, symlinked, one path."""
    here = Path(path).resolve()
    resolved = {p: Path(p).resolve() for p in {r["checkpoint"] for r in existing}}
    return [r for r in existing if resolved[r["checkpoint"]] == here]


def _cells_missing(path: str, mine: list[dict], scheme: Scheme, bits: Sequence[int], tasks: Sequence[Task],
                   settings: dict) -> list[tuple[int, Task]]:
    """The (bits, task) cells of ``path`` that its records ``mine`` lack."""
    done = {record_key({**r, "checkpoint": path}) for r in mine}
    return [(b, t) for b in bits for t in tasks if record_key(_key_fields(path, scheme, b, t, settings)) not in done]


def missing_cells(checkpoints: Sequence[str | os.PathLike], out: str | os.PathLike, target: str,
                  bits: Sequence[int] = (16, 8, 6, 4), tasks: Sequence[str] = ("wikitext2",),
                  granularity: str | None = None, group_size: int | None = None, limit: int | None = None,
                  seed: int = 0, calib_tokens: int | None = None, attn_impl: str = "eager",
                  subset: str = "first") -> list[tuple[str, int, str]]:
    """The (checkpoint, bits, task) cells of the :func:`run_sweep` with these arguments that ``out`` lacks, matched
    by path alone: no checkpoint is read, so it answers for checkpoints whose weights are not here (parked in
    history) as well. :func:`run_sweep` itself also checks that the records are of the same checkpoint files."""
    scheme = make_scheme(target, granularity, group_size, calib_tokens)
    settings = {"limit": limit, "subset": subset if limit is not None else None, "seed": seed, "attn_impl": attn_impl}
    resolved = list({t.name: t for t in map(resolve_task, tasks)}.values())
    bits = check_bits(scheme, bits)
    existing = read_records(out, missing_ok=True)
    return [(ckpt, b, t.name) for ckpt in dict.fromkeys(os.path.normpath(str(c)) for c in checkpoints)
            for b, t in _cells_missing(ckpt, _records_of(ckpt, existing), scheme, bits, resolved, settings)]


def _key_fields(path: str, scheme: Scheme, bits: int, task: Task, settings: dict) -> dict:
    return {"checkpoint": path, **scheme.fields(bits), "bits": bits, "task": task.name,
            **{k: settings[k] for k in ("limit", "subset", "seed", "attn_impl")}}


def _sweep_checkpoint(ckpt: _Checkpoint, scheme: Scheme, data: dict, settings: dict, calib_data: str, fh, bar,
                      progress: bool, counts: dict) -> None:
    device = distributed.local_device(settings["device"])  # "cuda" is this rank's GPU in a process group
    if settings["dispatch"]:
        from .offload import load_dispatched

        model = load_dispatched(ckpt.path, **settings["dispatch"])
    elif is_native_hf(ckpt.path):
        model = load_probed_hf(ckpt.path, device)
    else:
        model = load_checkpoint(ckpt.path, device=device, attn_impl=settings["attn_impl"])
    tokenizer = tokenizer_for(ckpt.path, settings["tokenizer"])
    about = {"checkpoint_sha256": ckpt.sha256, "label": checkpoint_label(ckpt.path), "arch": model.config.arch,
             "model": model.config.to_dict(), "params": sum(p.numel() for p in model.parameters()),
             "tokenizer": tokenizer.path,
             "tokenizer_sha256": hashlib.sha256(Path(tokenizer.path).read_bytes()).hexdigest() if tokenizer.path
             else None}
    calib = None
    for bits in dict.fromkeys(b for b, _ in ckpt.cells):
        config = scheme.config(bits)
        start = time.perf_counter()
        if bits == BASELINE_BITS:
            qmodel = model
        else:
            if scheme.needs_calibration and calib is None:
                calib = calibration_batch(tokenizer, model_max_len(model), scheme.calib_tokens, settings["seed"],
                                          calib_data).to(device)
            qmodel = quantize(model, config, calib=calib)
        quantize_s = time.perf_counter() - start
        for b, task in ckpt.cells:
            if b != bits:
                continue
            record = _score(qmodel, tokenizer, task, data[task.name], ckpt, scheme, bits, config, settings,
                            calib_data, progress)
            if fh is not None:  # rank 0 writes; the other ranks of a data-parallel sweep only score
                append_record(fh, {**record, **about, "quantize_s": quantize_s})
            counts["written"] += 1
            counts["nonfinite"] += "nonfinite" in record
            bar.update(1)
        del qmodel


def _score(model, tokenizer, task: Task, data, ckpt: _Checkpoint, scheme: Scheme, bits: int,
           config: QuantConfig, settings: dict, calib_data: str, progress: bool) -> dict:
    start = time.perf_counter()
    metrics, nonfinite = finite_metrics(evaluate_cell(model, tokenizer, task, data, settings["limit"],
                                                      settings["seed"], settings["batch_size"], progress,
                                                      settings["subset"] or "first"))
    wall = time.perf_counter() - start
    key = _key_fields(ckpt.path, scheme, bits, task, settings)
    record = {"schema": SCHEMA, **key, "kind": task.kind, "quant": config.to_dict(),
              "calib_data": calib_data if key["calib_tokens"] else None,
              "batch_size": settings["batch_size"], "device": settings["device"], "metrics": metrics,
              "versions": versions(), "wall_time_s": wall,
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if task.kind == "perplexity":
        record["data_sha256"] = data_fingerprint(data)
    if nonfinite:
        record["nonfinite"] = nonfinite
        log.warning("%s at %d bits on %s: %d of %d items or windows have NaN/Inf losses; metrics recorded as null",
                    ckpt.path, bits, task.name, nonfinite["units"], nonfinite["of"])
    return record
