"""Teacher sampling throughput: stories260K, exact ancestral sampling with the KV cache, one batch of stories.

    python experiments/bench_sample.py [--batch 256] [--max-len 512] [--threads 1]

Prints tokens/s (story tokens kept, BOS included) and the share of stories that reached max_len.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from diffquant import load_checkpoint
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.sample import sample_stories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_checkpoint(stories260k_path(), attn_impl="sdpa")
    start = time.perf_counter()
    stories = sample_stories(model, args.batch, torch.Generator().manual_seed(0), 1, [1, 2], args.max_len)
    seconds = time.perf_counter() - start
    tokens = sum(len(s) for s in stories)
    print(json.dumps({"batch": args.batch, "threads": args.threads, "tokens": tokens, "seconds": round(seconds, 2),
                      "tokens_per_s": round(tokens / seconds),
                      "mean_story_tokens": round(tokens / len(stories), 1),
                      "share_at_max_len": sum(len(s) == args.max_len for s in stories) / len(stories)}))


if __name__ == "__main__":
    main()
