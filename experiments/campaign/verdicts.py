"""Outlier-regime verdicts on the CPU-trained pairs (issue 13): gate, Table 5, Figure 8, seeds, trend.

    python experiments/campaign/verdicts.py [--out experiments/results/regime] [--windows 48] [--only NAME]

Pairs (identical data order within a pair; every arm is set against the Transformer):

* ``xs-lr1e-2-sN``: part 1's short protocol at lr 1e-2 (6.03M tokens, wsd, last 20% decayed), where the
  Transformer already passes the gate; seeds 0-1 from experiments/lr_sweep/runs, seeds 2+ and the gated /
  clipped arms (seed 0) from experiments/campaign/short;
* ``PRESET-lrLR-sN-<tokens>``: the long runs' cooled branches (experiments/campaign/long, cooldown.sh; xs seed 0
  is the long run, other seeds stop at earlier branches; the s preset for the size trend);
* ``xs-real-lr1e-2-s0``: the real-text control, the short protocol on real text (experiments/campaign/realtext.sh);
* ``xs-lr3e-3-sN-ABLATION-<tokens>``: the ablations (experiments/campaign/ablation.sh), cooled like the long runs;
* ``PRESET-lrLR-sN-streamed-<tokens>``: the long protocol on fresh teacher stories (experiments/campaign/streamed.sh),
  budgeted apart from the corpus runs.

Every pair is profiled on the real cased TinyStories held-out text (its first 64 windows of 512 tokens as in
part 1, global protocol, exact medians) and its attention logits swept at 16/8/6/4 bits with three scale
granularities on that text and on the held-out books (the first 48 windows of 512 tokens of each). The
best-trained pairs are also scored zero-shot (diffquant.study.zeroshot.ZEROSHOT_TASKS) and swept only on the
tasks where every arm is above chance (diffquant.chance; zeroshot.md). Each long run's tracked outliers are
averaged in blocks of 8.39M tokens with the flattening rule of diffquant.emergence (emergence.md).
Each streamed run's validation loss is set beside its corpus run's, step by step (fresh_curves.md).
Each arm's memorisation check (gate.md's last column) is read from its train log or from the
``memorisation.json`` that experiments/memorisation.py measures beside it.
Resumable: finished profiles and sweep cells are kept under --out and skipped on a rerun. The finals' weights
(except the shipped pair's) are parked in main's history (experiments/campaign/states.json): a pair is found by its
finals' config.json, and its cached records serve without the weights; a pair that needs new work names the
restore_states.sh command that brings them back.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from diffquant.checkpoint import load_checkpoint
from diffquant.checkpoint.files import WeightsParked, parked_weights
from diffquant.config import ARCHS
from diffquant.corpus import heldout_ids
from diffquant.emergence import block_means
from diffquant.io import atomic_write_text, compact_json_object, read_json_file
from diffquant.plots import plot_tracked
from diffquant.records import read_records
from diffquant.study.figure8 import sweep_pair, sweep_path
from diffquant.study.outputs import write_emergence, write_fresh_curves, write_outputs, write_zeroshot
from diffquant.study.pair import tokens_label
from diffquant.study.table5 import profile_pair, profile_path
from diffquant.study.verdict import verdict
from diffquant.study.zeroshot import zeroshot_check, zeroshot_path
from diffquant.tokenizer import Tokenizer
from diffquant.tracking import diff_lambdas

REPO = Path(__file__).resolve().parents[2]
STATES = REPO / "experiments/campaign/states.json"
CORPUS = REPO / "experiments/corpus/stories260k-s0"
SHORT_ROOTS = (REPO / "experiments/lr_sweep/runs", REPO / "experiments/campaign/short")
REAL_ROOT = REPO / "experiments/campaign/realtext"
LONG_ROOT = REPO / "experiments/campaign/long"
ABLATION_ROOT = REPO / "experiments/campaign/ablation"
STREAMED_ROOT = REPO / "experiments/campaign/streamed"
STREAMED_TAG = "-streamed"  # a streamed run's pairs and figures are named apart from the corpus run of its seed
LONG_RUN = re.compile(r"(?P<preset>[a-z]+)-lr(?P<lr>[0-9.]+e-\d+)-s(?P<seed>\d+)")  # long.sh's PRESET-lrLR-sSEED
ABLATION_RUN = re.compile(rf"(?P<base>{LONG_RUN.pattern})-(?P<ablation>.+)")  # the long run it ablates, and what
ABLATIONS = {"lambda0.8": "constant λ_init 0.8", "init-default": "PyTorch default init"}
SHORT_TOKENS = 736 * 16 * 512
SEQ_LEN, BATCH = 512, 16
EMERGENCE_BLOCK = 1024 * BATCH * SEQ_LEN  # tracked points averaged per 8.39M tokens (8 points)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def is_final(folder: Path) -> bool:
    """A finished run's final checkpoint, its weights here or parked (config.json stays in the tree)."""
    return (folder / "config.json").is_file()


def restore_command(pair: dict) -> str:
    """The restore_states.sh command that brings back the parked weights of ``pair``'s checkpoints."""
    parked = [run for run, parts in json.loads(STATES.read_text())["runs"].items() for part in parts
              for path in part["paths"] for ckpt in pair["checkpoints"].values()
              if f"{ckpt}/model.safetensors".startswith(f"{run}/{path}")]
    return "bash experiments/campaign/restore_states.sh " + " ".join(dict.fromkeys(parked))


def short_pairs(lr: str = "1e-2", roots=SHORT_ROOTS, name: str = "xs", corpus: str = "") -> list[dict]:
    """Part 1's short protocol: every seed with a Transformer and another arm under ``roots``."""
    pairs = []
    for seed in range(10):
        ckpts = {arch: rel(final) for arch in ARCHS for root in roots
                 if is_final(final := root / f"{arch}-lr{lr}-s{seed}" / "final")}
        if "transformer" in ckpts and len(ckpts) > 1:
            budget = f"{tokens_label(SHORT_TOKENS)} @ lr {lr}{corpus}"
            pairs.append({"pair": f"{name}-lr{lr}-s{seed}", "run": f"{name}-lr{lr}-s{seed}", "preset": "xs",
                          "seed": seed, "budget": budget,
                          "tokens": SHORT_TOKENS, "cooled": True, "checkpoints": ckpts})
    return pairs


def real_pairs() -> list[dict]:
    return short_pairs(roots=(REAL_ROOT,), name="xs-real", corpus=", real text")


def run_parts(run: Path) -> tuple[str, int, str]:
    """``PRESET-lrLR-sSEED`` → (preset, seed, lr)."""
    named = LONG_RUN.fullmatch(run.name)
    return named["preset"], int(named["seed"]), named["lr"]


def long_runs(root: Path | None = None) -> list[Path]:
    return sorted((run for run in (root or LONG_ROOT).glob("*-lr*-s*") if LONG_RUN.fullmatch(run.name)),
                  key=run_parts)


def emergence_suffix(run: Path) -> str:
    """File-name suffix of a run's emergence figure: xs seed 0 keeps the first name, other xs seeds ``-sN``; a
    learning rate other than 3e-3 is named."""
    preset, seed, lr = run_parts(run)
    if lr != "3e-3":
        return f"-{preset}-lr{lr}-s{seed}"
    return ("" if seed == 0 else f"-s{seed}") if preset == "xs" else f"-{preset}-s{seed}"


def cooled_pair(run: Path, branch: str, ckpts: dict[str, Path], preset: str, seed: int, lr: str,
                what: str = "", tag: str = "") -> dict | None:
    """The pair of a run's cooled branch (``stepN``) from the arms whose checkpoints exist, or None without a
    Transformer and another arm; ``what`` extends the budget label (an ablation is never pooled with others) and
    ``tag`` the pair's and its run's names (trend.md never joins runs on other data)."""
    ckpts = {a: rel(p) for a, p in ckpts.items() if is_final(p)}
    if "transformer" not in ckpts or len(ckpts) < 2:
        return None
    log = run / "cooldown" / f"{next(a for a in ckpts if a != 'transformer')}-{branch}" / "train_log.json"
    tokens = json.loads(log.read_text())["tokens_seen"]
    name = f"{run.name}{tag}"
    return {"pair": f"{name}-{tokens_label(tokens)}", "run": name, "preset": preset, "seed": seed,
            "budget": f"{tokens_label(tokens)} @ lr {lr}{what}", "tokens": tokens, "cooled": True,
            "checkpoints": ckpts}


def cooled_branches(run: Path, arch: str) -> list[str]:
    """The branches (``stepN``) ``arch`` has finished cooling in a run."""
    return [final.parent.name.split("-", 1)[1] for final in sorted((run / "cooldown").glob(f"{arch}-step*/final"))]


def long_pairs(root: Path | None = None, tag: str = "", what: str = "") -> list[dict]:
    """Cooled branches both arms of a long run finished: RUN/cooldown/ARCH-stepN/final."""
    pairs = []
    for run in long_runs(root):
        for branch in cooled_branches(run, "transformer"):
            ckpts = {a: run / "cooldown" / f"{a}-{branch}" / "final" for a in ARCHS}
            pairs.append(cooled_pair(run, branch, ckpts, *run_parts(run), what=what, tag=tag))
    return [p for p in pairs if p]


def streamed_pairs() -> list[dict]:
    """experiments/campaign/streamed.sh's cooled pairs: the long protocol on fresh teacher stories, named and
    budgeted apart from the corpus run of the same preset, seed and rate."""
    return long_pairs(STREAMED_ROOT, tag=STREAMED_TAG, what=", streamed")


def ablation_pairs() -> list[dict]:
    """experiments/campaign/ablation.sh's cooled arms; an ablation without its own Transformer is set against the
    long run's Transformer of the same seed and branch (same data order)."""
    pairs = []
    for run in sorted(ABLATION_ROOT.glob("*")):
        if not (named := ABLATION_RUN.fullmatch(run.name)):
            continue
        base = LONG_ROOT / named["base"]
        for branch in cooled_branches(run, "diff"):
            ckpts = {a: run / "cooldown" / f"{a}-{branch}" / "final" for a in ARCHS}
            if not is_final(ckpts["transformer"]):
                ckpts["transformer"] = base / "cooldown" / f"transformer-{branch}" / "final"
            what = f", {ABLATIONS.get(named['ablation'], named['ablation'])}"
            pairs.append(cooled_pair(run, branch, ckpts, *run_parts(base), what=what))
    return [p for p in pairs if p]


def with_train_logs(pair: dict) -> dict:
    """The pair with each arm's train log, where ``gate.md`` reads its memorisation check."""
    return {**pair, "train_logs": {arch: str(Path(path).parent / "train_log.json")
                                   for arch, path in pair["checkpoints"].items()}}


def with_lambdas(known: dict[str, dict], pair: dict, saved: Path) -> dict[str, dict]:
    """Table-5 records saved before Diff's λ was recorded get it from their checkpoints (no new profile)."""
    if all("lambda" in record for record in known.values()):
        return known
    known = {arch: {**record, "lambda": diff_lambdas(load_checkpoint(REPO / pair["checkpoints"][arch]))}
             for arch, record in known.items()}
    atomic_write_text(saved, compact_json_object(known))
    return known


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="experiments/results/regime")
    parser.add_argument("--profile-windows", type=int, default=64,
                        help="windows of 512 held-out tokens profiled (part 1's protocol: 64)")
    parser.add_argument("--only", default=None, help="evaluate only the pairs whose name contains this (a second "
                        "process can share the work; a last run without it writes every table)")
    parser.add_argument("--windows", type=int, default=48, help="perplexity windows per task (each sweep cell)")
    parser.add_argument("--zeroshot-min-tokens", type=float, default=80e6,
                        help="zero-shot chance tests on pairs trained on at least this many tokens (the best-trained: "
                        "if they are at chance, so are the others)")
    parser.add_argument("--no-zeroshot", action="store_true",
                        help="skip the zero-shot step (~12 minutes a pair on 2 cores): zeroshot.md stays as it is")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_flush_denormal(True)  # 2x faster on the lr-1e-2 pairs (experiments/results/throughput.md)
    out = Path(args.out)
    ids = heldout_ids(Tokenizer.load(CORPUS / "tokenizer.model"))
    tasks = {"tinystories": args.windows, "test": args.windows}
    pairs = [with_train_logs(p) for p in short_pairs() + long_pairs() + real_pairs() + ablation_pairs()
             + streamed_pairs() if args.only is None or args.only in p["pair"]]
    results, table5 = [], {}
    for pair in pairs:
        logging.info("pair %s: %s", pair["pair"], ", ".join(pair["checkpoints"]))
        with needs_weights(pair):
            known = table5_record(pair, ids, profile_path(out, pair["pair"]), args.profile_windows)
            table5[pair["pair"]] = known
            records = sweep_pair(pair, sweep_path(out, pair), tasks, batch_size=BATCH)
        results.append(verdict(pair, known, records))
    write_outputs(out, results, table5)
    if not args.no_zeroshot:
        zeroshot(out, [p for p in pairs if p["tokens"] >= args.zeroshot_min_tokens])
    runs, blocks = run_logs(), {}
    for (run, tag), logs in runs.items():
        if logs:
            plot_tracked(logs, out / f"long-emergence{emergence_suffix(run)}{tag}.png")
        if "transformer" in logs and "diff" in logs:
            blocks[run.name + tag] = block_means(logs["transformer"], logs["diff"], EMERGENCE_BLOCK)
    write_emergence(out, blocks)
    write_fresh_curves(out, fresh_runs(runs))
    for pair in pairs:  # the emergence curves of pairs with the gated / clipped arms
        if len(pair["checkpoints"]) > 2:
            logs = {arch: json.loads((REPO / path).parent.joinpath("train_log.json").read_text())
                    for arch, path in pair["checkpoints"].items()}
            plot_tracked(logs, out / f"emergence-{pair['pair']}.png")


def table5_record(pair: dict, ids, saved: Path, windows: int) -> dict[str, dict]:
    """The pair's Table-5 profile: cached at ``saved``, or profiled now."""
    known = read_json_file(saved) if saved.is_file() else {}
    stale = set(known) != set(pair["checkpoints"]) or not all("lambda" in record for record in known.values())
    if stale and (absent := parked_weights(pair["checkpoints"].values(), REPO)):
        raise WeightsParked(absent[0], f"{saved} lacks its profile")
    if set(known) != set(pair["checkpoints"]):
        known = profile_pair(pair, ids, SEQ_LEN, BATCH, windows * SEQ_LEN, out=saved)
    return with_lambdas(known, pair, saved)


@contextmanager
def needs_weights(pair: dict):
    """A pair whose work needs weights that are parked stops the script with one line that says how to restore
    them (nothing is written for it)."""
    try:
        yield
    except WeightsParked as error:
        sys.exit(f"verdicts.py: pair {pair['pair']}: {error}; restore its weights with: {restore_command(pair)}")


def zeroshot(out: Path, pairs: list[dict]) -> None:
    """The zero-shot tasks each pair answers above chance, and Figure 8 on those tasks only."""
    verdicts = []
    for pair in pairs:
        with needs_weights(pair):
            verdicts.append(zeroshot_check(pair, zeroshot_path(out, pair), batch_size=BATCH))
    write_zeroshot(out, verdicts, lambda v: read_records(zeroshot_path(out, v)))


def run_logs() -> dict[tuple[Path, str], dict[str, dict]]:
    """Every long and streamed run's train logs (``long_logs``), keyed by (run folder, the tag of its pairs)."""
    runs = {(run, ""): long_logs(run) for run in long_runs()}
    return runs | {(run, STREAMED_TAG): long_logs(run) for run in long_runs(STREAMED_ROOT)}


def fresh_runs(runs: dict[tuple[Path, str], dict[str, dict]]) -> dict[str, tuple[dict, dict]]:
    """Each streamed run's logs with those of the corpus run of its preset, rate and seed, by its pairs' run name."""
    return {run.name + tag: (logs, runs[LONG_ROOT / run.name, ""]) for (run, tag), logs in runs.items()
            if tag == STREAMED_TAG and (LONG_ROOT / run.name, "") in runs}


def long_logs(run: Path) -> dict[str, dict]:
    """A long run's train logs (stable arms, then each cooldown) for the emergence figure."""
    logs = {arch: json.loads(f.read_text()) for arch in ARCHS if (f := run / arch / "train_log.json").is_file()}
    for f in sorted((run / "cooldown").glob("*/train_log.json")):
        arch, step = f.parent.name.split("-", 1)
        logs[f"{arch} cooled from {step}"] = json.loads(f.read_text())
    return logs


if __name__ == "__main__":
    main()
