"""The ``diffquant`` command line. Each sub-command is a small function; errors become one line and exit 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .checkpoint import load_checkpoint
from .model import num_params

log = logging.getLogger("diffquant")

EXIT_USAGE = 2  # bad input: a one-line message on stderr, never a traceback


class UserError(Exception):
    """An error caused by what the user asked for; reported as one line."""


def cmd_info(args: argparse.Namespace) -> int:
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
            "heads": cfg.n_heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.dim_head,
            "sub_heads_per_head": cfg.sub_heads_per_head,
        },
    }
    print(json.dumps(summary, indent=2))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from .config import ModelConfig
    from .train import TrainConfig, split_tokens, train

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffquant",
        description="Profile activation outliers, quantize checkpoints and print degradation tables "
                    "for Differential Transformers and matched Transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print a checkpoint's config and parameter counts")
    info.add_argument("checkpoint", help="checkpoint folder or .gguf file")
    info.set_defaults(func=cmd_info)
    _add_train(sub)
    return parser


def _add_train(sub) -> None:
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
    p.set_defaults(func=cmd_train)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (UserError, ValueError, FileNotFoundError, RuntimeError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"diffquant: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("diffquant: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
