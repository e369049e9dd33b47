"""Zero-shot chance tests: which tasks every arm of a pair answers above chance, and Figure 8 on those only."""

from __future__ import annotations

import logging
from pathlib import Path

from ..chance import PREDICTION, above_chance
from ..kinds import ATTN_LOGITS
from ..records import read_records
from ..tables import render
from .cells import fmt, yes_no
from .figure8 import records_path, sweep_or_reuse, sweep_pair

log = logging.getLogger(__name__)

# zero-shot tasks (items: the first N; COPA has 100) checked for above-chance accuracy before their Figure 8
ZEROSHOT_TASKS = {"copa": None, "piqa": 500, "winogrande": 500, "arc_easy": 500, "openbookqa": 500, "boolq": 500,
                  "hellaswag": 200}
ZEROSHOT_ALPHA = 0.05  # family-wise, Bonferroni over every (task, arm, metric) of a pair


def zeroshot_path(out: Path, pair: dict) -> Path:
    """Where a pair's zero-shot records (and Figure 8 on its tasks above chance) live under an output folder."""
    return records_path(Path(out) / "zeroshot", pair["pair"])


def zeroshot_pair(pair: dict, path: Path, tasks: dict[str, int | None] = ZEROSHOT_TASKS, batch_size: int = 32,
                  device: str = "cpu") -> list[dict]:
    """Unquantized zero-shot records of every arm (resumable JSONL at ``path``), for :func:`zeroshot_verdict`."""
    for task, limit in tasks.items():
        sweep_or_reuse(list(pair["checkpoints"].values()), path, ATTN_LOGITS, bits=(16,), tasks=[task], limit=limit,
                       batch_size=batch_size, device=device)
    return read_records(path)


def zeroshot_check(pair: dict, path: Path, tasks: dict[str, int | None] = ZEROSHOT_TASKS, batch_size: int = 32,
                   device: str = "cpu") -> dict:
    """:func:`zeroshot_verdict` on freshly scored (or resumed) records, then Figure 8 on the tasks above chance,
    all in the JSONL at ``path``."""
    verdict = zeroshot_verdict(pair, zeroshot_pair(pair, path, tasks, batch_size, device))
    log.info("pair %s: above chance on %s", pair["pair"], ", ".join(verdict["above_chance"]) or "no task")
    if verdict["above_chance"]:
        sweep_pair(pair, path, {t: tasks[t] for t in verdict["above_chance"]}, batch_size, device)
    return verdict


def zeroshot_verdict(pair: dict, records: list[dict], alpha: float = ZEROSHOT_ALPHA,
                     n_permutations: int = 20_000) -> dict:
    """Which zero-shot tasks every arm of ``pair`` answers above chance (:func:`~diffquant.chance.above_chance`
    on the unquantized records, acc and acc_norm), at family-wise level ``alpha`` (Bonferroni). A task counts
    when, for one metric, every arm passes: only there is a Figure-8 accuracy comparison more than noise."""
    tests = [{"task": r["task"], "arch": r["arch"], **above_chance(r["metrics"]["items"], metric, n_permutations)}
             for r in records if r["bits"] == 16 and r["kind"] == "multiple_choice" for metric in PREDICTION]
    threshold = alpha / max(1, len(tests))
    arms = set(pair["checkpoints"])
    passing = sorted(task for task in {t["task"] for t in tests}
                     if any({t["arch"] for t in tests if (t["task"], t["metric"]) == (task, metric)
                             and t["p"] <= threshold} == arms for metric in PREDICTION))
    return {"pair": pair["pair"], "tokens": pair["tokens"], "alpha": alpha, "threshold": threshold,
            "n_permutations": n_permutations, "tests": tests, "above_chance": passing}


def zeroshot_table(verdicts: list[dict]) -> str:
    """One row per pair, task and arm: accuracy, the two chance levels and the permutation p of acc and acc_norm."""
    rows = []
    for v in verdicts:
        by_key = {(t["task"], t["arch"], t["metric"]): t for t in v["tests"]}
        for task, arch in dict.fromkeys((t["task"], t["arch"]) for t in v["tests"]):
            acc, norm = by_key[(task, arch, "acc")], by_key[(task, arch, "acc_norm")]
            rows.append([v["pair"], task, arch, acc["n"], fmt(acc["accuracy"], 3), fmt(acc["uniform_chance"], 3),
                         fmt(acc["shuffled_chance"], 3), f"{acc['p']:.2g}", fmt(norm["accuracy"], 3),
                         f"{norm['p']:.2g}", yes_no(task in v["above_chance"])])
    header = ["pair", "task", "arm", "items", "acc", "chance 1/k", "chance shuffled", "p (acc)", "acc_norm",
              "p (acc_norm)", "every arm above chance"]
    return render(header, rows)
