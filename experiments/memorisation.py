"""Memorisation of runs trained on a fixed (cycled) teacher corpus: loss on fresh teacher stories minus on the
stories the run trained on, per token, with its standard error (``diffquant.stream.memorisation_check``).

    nice python experiments/memorisation.py RUN [RUN ...] [--teacher calib/models/stories260K.gguf] [--out FILE]

Each RUN is a finished run folder (``final/`` and ``train_log.json`` with its corpus). Its training windows are
the batches of eight training steps spread over the run (``stream.check_steps``), regenerated from the corpus
exactly as training drew them (``train.batch_at``); the fresh windows are as many windows of new teacher stories,
drawn as ``diffquant train --data DIR --teacher MODEL`` draws them for the run's seed, so the check equals the one
that training would have logged. Each run's record is written beside its log as ``memorisation.json``, where
``gate.md`` reads it (``diffquant.study.memorisation``). Skipped, with a line each: streamed runs and runs whose log
has the check already (nothing to add), and runs not trained on this teacher's samples (real text: no fresh
stories to compare with).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import torch

from diffquant.checkpoint import load_checkpoint
from diffquant.corpus import file_sha256, load_corpus
from diffquant.io import dump_json
from diffquant.stream import DEFAULT_DRAW_BATCH, TokenStream, check_steps, memorisation_check
from diffquant.study.memorisation import MEASURED_FILE
from diffquant.train import TrainConfig, corpus_windows

log = logging.getLogger("memorisation")


def trained_windows(log_record: dict) -> tuple[np.ndarray, TrainConfig]:
    known = set(TrainConfig.__dataclass_fields__)
    cfg = TrainConfig(**{k: v for k, v in log_record["train_config"].items() if k in known and k != "snapshots"})
    corpus = load_corpus(log_record["data"]["corpus"], vocab_size=log_record["model_config"]["vocab_size"]).ids
    return corpus_windows(corpus, check_steps(cfg.steps), cfg), cfg


def why_skipped(log_record: dict, teacher_sha256: str) -> str | None:
    if log_record["data"].get("streamed") or log_record.get("memorisation"):
        return "its train log has the check already"
    if log_record["data"].get("teacher_sha256") != teacher_sha256:
        return "not trained on samples of this teacher"
    return None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--teacher", default="calib/models/stories260K.gguf")
    parser.add_argument("--draw", type=int, default=DEFAULT_DRAW_BATCH,
                        help="fresh stories decoded at once (training's default; its --stream-block-tokens sets it)")
    parser.add_argument("--out", default=None, help="also write every record here as one JSON object")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    teacher_sha256 = file_sha256(Path(args.teacher))
    fresh: dict[tuple[int, int, int], np.ndarray] = {}
    records = {}
    for run in map(Path, args.runs):
        log_record = json.loads((run / "train_log.json").read_text())
        if reason := why_skipped(log_record, teacher_sha256):
            log.info("%s: skipped, %s", run, reason)
            continue
        trained, cfg = trained_windows(log_record)
        key = (cfg.seed, cfg.seq_len, len(trained))
        if key not in fresh:
            stream = TokenStream(args.teacher, cfg.seed, cfg.batch_size, cfg.seq_len, draw_batch=args.draw)
            fresh[key] = stream.fresh_windows(len(trained))
        result = memorisation_check(load_checkpoint(run / "final"), trained, fresh[key], cfg.batch_size, "cpu")
        records[str(run)] = {"note": "fixed corpus, measured after training", "steps": check_steps(cfg.steps),
                             "corpus_tokens": log_record["data"].get("corpus_tokens"),
                             "tokens_seen": log_record["tokens_seen"], **result}
        dump_json(records[str(run)], run / MEASURED_FILE)
        log.info("%s: fresh − training %+.4f ± %.4f nats/token (fresh %.4f, training %.4f)", run, result["gap"],
                 result["se"], result["fresh_loss"], result["train_loss"])
    if args.out:
        dump_json(records, args.out)
    return records


if __name__ == "__main__":
    main()
