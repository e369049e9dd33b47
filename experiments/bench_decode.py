"""What the one-query decoding path buys the teacher's sampler on the CPU, measured side by side in one run.

    nice python experiments/bench_decode.py [--draws 64 256] [--max-len 512] [--repeats 2] [--out FILE]

A decoding step has one query per row that sees every cached key. ``diffquant.model._sdpa`` runs it as two batched
matmuls (``_one_query``); before, it went to torch's sdpa, which on the CPU needs q, k and v padded to width 16, so
every step copied the whole cache. This samples the same stories from stories260K (float64, as ``diffquant sample``
and ``diffquant.stream`` draw them) both ways, alternating the two paths ``--repeats`` times, and reports tokens per
CPU second of this process (one thread; a busy machine slows the wall clock, not these rates), their ratio, and
whether both paths drew the same stories. Prints one JSON record; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from diffquant import model as model_module
from diffquant.checkpoint import load_checkpoint
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.io import dump_json
from diffquant.sample import PRECISION, sample_stories
from diffquant.tokenizer import tokenizer_for

PATHS = {"one_query": model_module._sdpa, "padded_sdpa": model_module._sdpa_kernel}


def sample_with(path: str, model, n: int, max_len: int, bos: int, stops: list[int]) -> tuple[list, float]:
    """Stories drawn with ``path`` as the sdpa kernel, and the CPU seconds they took."""
    model_module.FUSED_KERNELS["sdpa"] = PATHS[path]
    try:
        start = time.process_time()
        stories = sample_stories(model, n, torch.Generator().manual_seed(n), bos, stops, max_len)
        return stories, time.process_time() - start
    finally:
        model_module.FUSED_KERNELS["sdpa"] = model_module._sdpa


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, nargs="+", default=[64, 256], help="stories decoded at once")
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", help="also write the record here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    teacher = stories260k_path()
    tokenizer = tokenizer_for(teacher)
    model = load_checkpoint(teacher, attn_impl="sdpa", dtype=PRECISION).eval()
    stops = sorted({i for i in (tokenizer.eos_id, tokenizer.bos_id) if i is not None})
    record = {"teacher": "stories260K", "precision": str(PRECISION).removeprefix("torch."), "threads": 1,
              "max_len": args.max_len, "repeats": args.repeats, "draws": {}}
    for n in args.draws:
        seconds = {path: 0.0 for path in PATHS}
        drawn: dict[str, list] = {}
        for _ in range(args.repeats):
            for path in PATHS:
                drawn[path], cpu = sample_with(path, model, n, args.max_len, tokenizer.bos_id, stops)
                seconds[path] += cpu
        tokens = args.repeats * sum(len(s) for s in drawn["one_query"])
        rates = {path: round(tokens / s) for path, s in seconds.items()}
        record["draws"][str(n)] = {
            "tokens_per_cpu_s": rates, "speedup": round(rates["one_query"] / rates["padded_sdpa"], 2),
            "same_stories": all(np.array_equal(a, b) for a, b in zip(*drawn.values(), strict=True))}
    print(dump_json(record, args.out))
    return record


if __name__ == "__main__":
    main()
