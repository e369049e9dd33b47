"""Memorisation of runs trained on a fixed (cycled) teacher corpus: loss on fresh teacher stories minus on the
stories the run trained on, per token, with its standard error (``diffquant.stream.memorisation_check``).

    nice python experiments/memorisation.py RUN [RUN ...] [--teacher calib/models/stories260K.gguf] [--out FILE]

Each RUN is a finished run folder (``final/`` and ``train_log.json`` with its corpus). Its training windows are
the batches of eight training steps spread over the run (``stream.check_steps``), regenerated from the corpus
exactly as training drew them (``train.batch_at``); the fresh windows are as many windows of new teacher stories
(one draw shared by every run given). A streamed run needs none of this: its log already has the check.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from diffquant.checkpoint import load_checkpoint
from diffquant.corpus import load_corpus
from diffquant.stream import TokenStream, check_steps, memorisation_check
from diffquant.train import TrainConfig, batch_at


def trained_windows(run: Path, log: dict) -> tuple[np.ndarray, TrainConfig]:
    known = {f for f in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(**{k: v for k, v in log["train_config"].items() if k in known and k != "snapshots"})
    corpus = load_corpus(log["data"]["corpus"], vocab_size=log["model_config"]["vocab_size"]).ids
    batches = (batch_at(corpus, step, cfg) for step in check_steps(cfg.steps))
    return np.concatenate([torch.cat([x, y[:, -1:]], 1).numpy() for x, y in batches]), cfg


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--teacher", default="calib/models/stories260K.gguf")
    parser.add_argument("--out", default=None, help="write the records here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fresh: dict[tuple[int, int], np.ndarray] = {}
    records = {}
    for run in map(Path, args.runs):
        log = json.loads((run / "train_log.json").read_text())
        trained, cfg = trained_windows(run, log)
        key = (cfg.seq_len, len(trained))
        if key not in fresh:
            stream = TokenStream(args.teacher, 0, cfg.batch_size, cfg.seq_len)
            fresh[key] = stream.fresh_windows(len(trained))
        model = load_checkpoint(run / "final")
        result = memorisation_check(model, trained, fresh[key], 16, "cpu")
        records[str(run)] = {"note": "fixed corpus", "corpus_tokens": log["data"].get("corpus_tokens"),
                             "tokens_seen": log["tokens_seen"], "steps": check_steps(cfg.steps), **result}
        print(f"{run}: fresh − training {result['gap']:+.4f} ± {result['se']:.4f} nats/token "
              f"(fresh {result['fresh_loss']:.4f}, training {result['train_loss']:.4f})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    return records


if __name__ == "__main__":
    main()
