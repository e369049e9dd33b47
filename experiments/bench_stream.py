"""What streaming teacher samples into training costs against training from a stored corpus, on the CPU.

    nice python experiments/bench_stream.py [--presets xs s] [--steps 4] [--batch 16] [--draw 256]

One thread. Times are CPU seconds of this process (``time.process_time``), so a busy machine slows the wall clock
but not the numbers; wall seconds are printed beside them. Measured: the teacher's sampling rate (stories260K in
float64, ``--draw`` stories decoded at once, up to 512 tokens, exactly as ``diffquant.stream`` draws a block), and
each preset's training rate (forward + backward + AdamW, Transformer and Diff, on the same windows from a corpus
and from the stream). A streamed run pays both for each token; a pair sharing its blocks through
``--stream-cache`` pays the sampling once for two arms. Prints one JSON record.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from diffquant import ModelConfig, build_model
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.stream import TokenStream
from diffquant.train import TrainConfig, _train_step, make_optimizer


def clocks() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def since(start: tuple[float, float]) -> tuple[float, float]:
    cpu, wall = clocks()
    return cpu - start[0], wall - start[1]


def train_rate(preset: str, arch: str, data, cfg: TrainConfig, steps: int) -> dict:
    """Tokens per CPU second of ``steps`` training steps on ``data`` (a corpus array or a stream)."""
    model = build_model(ModelConfig.preset(preset, arch=arch, attn_impl="sdpa"), seed=0).train()
    opt = make_optimizer(model, cfg)
    _train_step(model, opt, cfg, data, 0)  # warm-up, not timed
    start = clocks()
    for step in range(1, steps + 1):
        _train_step(model, opt, cfg, data, step)
    cpu, wall = since(start)
    tokens = steps * cfg.batch_size * cfg.seq_len
    return {"tokens_per_cpu_s": round(tokens / cpu), "tokens_per_wall_s": round(tokens / wall)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["xs", "s"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--draw", type=int, default=256, help="stories decoded at once")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as `diffquant train` runs
    windows = (args.steps + 1) * args.batch
    stream = TokenStream(stories260k_path(), 0, args.batch, args.seq_len, draw_batch=args.draw,
                         block_tokens=windows * args.seq_len)
    start = clocks()
    stream.block(0)  # one block: every window the timed steps read
    cpu, wall = since(start)
    sampling = {"tokens_drawn": stream.tokens_drawn, "tokens_per_cpu_s": round(stream.tokens_drawn / cpu),
                "tokens_per_wall_s": round(stream.tokens_drawn / wall)}
    corpus = stream.block(0)[:, :-1].reshape(-1).astype(np.uint16)  # the same tokens, as random windows
    cfg = TrainConfig(tokens=args.batch * args.seq_len, batch_size=args.batch, seq_len=args.seq_len)
    record = {"threads": 1, "batch": args.batch, "seq_len": args.seq_len, "steps": args.steps, "draw": args.draw,
              "sampling": sampling, "presets": {}}
    rate = sampling["tokens_per_cpu_s"]
    for preset in args.presets:
        for arch in ("transformer", "diff"):
            from_corpus = train_rate(preset, arch, corpus, cfg, args.steps)
            from_stream = train_rate(preset, arch, stream, cfg, args.steps)  # the block is drawn: training only
            train = from_stream["tokens_per_cpu_s"]
            record["presets"][f"{preset}/{arch}"] = {
                "corpus": from_corpus, "stream_training_only": from_stream,
                "streamed_tokens_per_cpu_s": round(1 / (1 / train + 1 / rate)),
                "streamed_pair_shared_blocks_tokens_per_cpu_s": round(1 / (1 / train + 0.5 / rate)),
                "streamed_over_corpus": round(1 / (1 / train + 1 / rate) / from_corpus["tokens_per_cpu_s"], 3),
            }
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
