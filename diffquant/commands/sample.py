"""`diffquant sample CKPT --tokens N --seed S --out DIR`: a teacher corpus drawn from a checkpoint."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    p = sub.add_parser("sample", help="draw a teacher corpus (token shards + manifest) by exact ancestral sampling")
    p.add_argument("checkpoint", help="teacher: checkpoint folder or .gguf file (with its tokenizer)")
    p.add_argument("--tokens", type=int, required=True, help="at least this many tokens (whole shards)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="corpus folder (resumed when it holds the same corpus)")
    p.add_argument("--batch-size", type=int, default=256, help="stories decoded at once (part of the seed's meaning)")
    p.add_argument("--max-len", type=int, default=512, help="longest story in tokens, BOS included")
    p.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard (default 2^21)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; the bytes do not depend on it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..sample import DEFAULT_SHARD_TOKENS, sample_corpus

    if args.threads:
        torch.set_num_threads(args.threads)
    command = "diffquant " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["sample"] else None
    manifest = sample_corpus(args.checkpoint, args.out, args.tokens, seed=args.seed, batch_size=args.batch_size,
                             max_len=args.max_len, shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS,
                             command=command)
    rates = [s["tokens_per_s"] for s in manifest["shards"]]
    print(json.dumps({"out": args.out, "tokens_requested": args.tokens, "tokens": manifest["tokens"],
                      "note": "at least --tokens, in whole shards", "stories": manifest["stories"],
                      "shards": len(manifest["shards"]),
                      "tokens_per_s": round(sum(rates) / len(rates)) if rates else None}, indent=2))
    return 0
