"""`diffquant info CKPT`: a checkpoint's config and parameter counts."""

from __future__ import annotations

import argparse
import json

from ..checkpoint import load_checkpoint
from ..model import num_params


def register(sub) -> None:
    p = sub.add_parser("info", help="print a checkpoint's config and parameter counts")
    p.add_argument("checkpoint", help="checkpoint folder or .gguf file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load_checkpoint(args.checkpoint)
    cfg = model.config
    embed = model.embed.weight.numel()
    total = num_params(model)
    summary = {
        "checkpoint": str(args.checkpoint),
        "config": cfg.to_dict(),
        "parameters": {
            "total": total,
            "embedding": embed,
            "non_embedding": total - embed,
            "per_layer": num_params(model.layers[0]),
        },
        "heads": {
            "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "sub_heads_per_head": cfg.sub_heads_per_head,
        },
    }
    print(json.dumps(summary, indent=2))
    return 0
