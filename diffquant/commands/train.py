"""`diffquant train`: train a model on the calib train split (resumable, logged)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..errors import UserError


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model on the calib train split (resumable)")
    p.add_argument("--arch", choices=["transformer", "diff"], required=True)
    p.add_argument("--preset", default="small", help="tiny | small | base")
    p.add_argument("--tokens", type=int, required=True, help="training token budget")
    p.add_argument("--out", required=True, help="run folder (state/, snapshots/, final/, train_log.json)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=None, help="default: the preset's max_seq_len")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--schedule", choices=["cosine", "linear"], default="cosine")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--device", default="cpu")
    p.add_argument("--attn-impl", default="sdpa", choices=["eager", "sdpa", "flash"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--init-from", default=None, help="start from this checkpoint's weights (train further)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..config import ModelConfig
    from ..train import TrainConfig, split_tokens, train

    if args.threads:
        torch.set_num_threads(args.threads)
    model_cfg = ModelConfig.preset(args.preset, arch=args.arch)
    model_cfg = dataclasses.replace(model_cfg, attn_impl=args.attn_impl)
    cfg = TrainConfig(
        tokens=args.tokens, batch_size=args.batch_size, seq_len=args.seq_len or model_cfg.max_seq_len,
        lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule, bf16=args.bf16,
        device=args.device, seed=args.seed, eval_every=args.eval_every, save_every=args.save_every,
    )
    if cfg.seq_len > model_cfg.max_seq_len:
        raise UserError(f"--seq-len {cfg.seq_len} exceeds the preset's max_seq_len {model_cfg.max_seq_len}")
    train_ids, train_info = split_tokens("train")
    val_ids, val_info = split_tokens("validation")
    record = train(model_cfg, cfg, args.out, train_ids, val_ids, resume=args.resume, init_from=args.init_from,
                   provenance={**train_info, **val_info, "command": "diffquant " + " ".join(sys.argv[1:])})
    val = record["history"]["val"]
    print(json.dumps({"out": str(args.out), "steps": record["step"], "tokens": record["tokens_seen"],
                      "validation_loss": val[-1]["loss"] if val else None}, indent=2))
    return 0
