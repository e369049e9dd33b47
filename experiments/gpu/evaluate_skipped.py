"""Evaluate on the CPU the pair the H200 run's time guard skipped (xs-s1-100M), with run_gpu.py's protocol.

    nice python experiments/gpu/evaluate_skipped.py --run /tmp/h200 \
        --out experiments/results/gpu/2026-12-04-h200/cpu-eval

``--run``: the H200 outputs with ``results.tgz`` and ``ckpt.tgz`` unpacked into one folder (``cooled/``,
``corpus/``, ``pairs.json``, ``table5/``, ``figure8/``). The pair's two cooled checkpoints are profiled on the
whole real cased TinyStories held-out text (Table 5, global protocol) and swept at 16/8/6/4 bits over the three
scale granularities on that text and 200 windows of the held-out books (Figure 8): ``run_gpu.FULL``'s settings
(sequence length 512, batch 32), only the device differs. Outputs under ``--out``: ``table5/PAIR.json.gz``,
``figure8/PAIR.jsonl.gz``, ``PAIR.json`` (the verdict), and ``five-pairs/`` — the verdict files of the four pairs the
H200 evaluated plus this one (``diffquant.study.outputs.write_outputs``; its figure8 records are copies of the run's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import torch

from diffquant.corpus import heldout_ids
from diffquant.io import atomic_write_text, read_json_file
from diffquant.records import read_records
from diffquant.study.figure8 import sweep_pair, sweep_path
from diffquant.study.outputs import write_outputs
from diffquant.study.table5 import profile_pair, profile_path
from diffquant.study.verdict import verdict
from diffquant.tokenizer import Tokenizer

log = logging.getLogger("evaluate_skipped")
HERE = Path(__file__).resolve().parent
ARCHS = ("transformer", "diff")  # the order of the H200 run's pairs.json entries


def run_gpu_module():
    spec = importlib.util.spec_from_file_location("run_gpu", HERE / "run_gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_gpu"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def skipped_pair(root: Path, preset: str, seed: int, budget: str) -> dict:
    """The cooled pair of (preset, seed, budget) as the H200 run named it (``cooled/PRESET-sSEED-ARCH-BUDGET``),
    entered as that run's pairs.json entries are; read from the folders, not from run_gpu.py's current plan (which
    has been re-planned since)."""
    folders = {arch: root / "cooled" / f"{preset}-s{seed}-{arch}-{budget}" for arch in ARCHS}
    missing = [str(f / "final") for f in folders.values() if not (f / "final").is_dir()]
    if missing:
        raise SystemExit(f"no checkpoint at {', '.join(missing)}: unpack ckpt.tgz and results.tgz into --run")
    tokens = {json.loads((f / "train_log.json").read_text())["tokens_seen"] for f in folders.values()}
    if len(tokens) != 1:
        raise SystemExit(f"the two arms of {preset}-s{seed}-{budget} saw different token counts: {sorted(tokens)}")
    return {"pair": f"{preset}-s{seed}-{budget}", "preset": preset, "seed": seed, "budget": budget,
            "tokens": tokens.pop(), "cooled": True,
            "checkpoints": {arch: str(f / "final") for arch, f in folders.items()},
            "train_logs": {arch: str(f / "train_log.json") for arch, f in folders.items()}}


def five_pairs(run: Path, out: Path, new: dict, new_table5: dict) -> None:
    """The verdict files of the run's evaluated pairs plus the new one (figure8 records copied beside them)."""
    results = json.loads((run / "pairs.json").read_text())
    table5 = {r["pair"]: read_json_file(profile_path(run, r["pair"])) for r in results}
    folder = out / "five-pairs"
    (folder / "figure8").mkdir(parents=True, exist_ok=True)
    for source in [sweep_path(run, r) for r in results] + [sweep_path(out, new)]:
        shutil.copyfile(source, folder / "figure8" / source.name)  # plain or gzip: the name says which
    note = (f"{new['pair']} evaluated on the CPU by experiments/gpu/evaluate_skipped.py (the H200's time guard "
            "skipped it); the other pairs on the H200. Same checkpoints, text, windows and settings.\n\n")
    write_outputs(folder, sorted(results + [new], key=lambda r: (r["tokens"], r["seed"])),
                  {**table5, new["pair"]: new_table5}, note)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the unpacked H200 outputs")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget", default="100M", help="the budget label of the run's cooled folders")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    script, run, out = run_gpu_module(), Path(args.run), Path(args.out)
    plan = script.FULL
    pair = skipped_pair(run, "xs", args.seed, args.budget)
    val = heldout_ids(Tokenizer.load(run / "corpus" / "tokenizer.model"))
    start = time.perf_counter()
    table5 = profile_pair(pair, val, plan.seq_len, plan.eval_batch, plan.profile_tokens, "cpu",
                          out=profile_path(out, pair["pair"]))
    profiled = time.perf_counter() - start
    records = sweep_pair(pair, sweep_path(out, pair), plan.sweep_limits, plan.eval_batch, "cpu")
    result = verdict(pair, table5, records)
    result["evaluated_on"] = {"device": "cpu", "threads": args.threads, "profile_s": round(profiled, 1),
                              "total_s": round(time.perf_counter() - start, 1), "torch": torch.__version__}
    atomic_write_text(out / f"{pair['pair']}.json", json.dumps(result, indent=1))
    five_pairs(run, out, result, table5)
    log.info("%s: gate %s, logit T/D %.2f, hidden T/D %.2f in %.0f s", pair["pair"], result["gate"],
             result["versus"]["diff"]["logit_ratio"], result["versus"]["diff"]["hidden_ratio"],
             result["evaluated_on"]["total_s"])
    assert read_records(sweep_path(out, pair))  # the sweep wrote its records
    return result


if __name__ == "__main__":
    main()
