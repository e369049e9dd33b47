"""`diffquant train`: train a model on the calib train split, a token corpus or a teacher's streamed samples
(resumable, logged)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
from pathlib import Path

from ..config import ARCHS, ATTN_IMPLS
from ..errors import UserError

log = logging.getLogger(__name__)

def register(sub) -> None:
    p = sub.add_parser("train", help="train a model on the calib train split or a token corpus (resumable)")
    p.add_argument("--arch", choices=ARCHS, required=True)
    p.add_argument("--preset", default="small", help="tiny | small | base | xs | s | m | l")
    p.add_argument("--tokens", type=int, required=True, help="training token budget")
    p.add_argument("--out", required=True, help="run folder (state/, snapshots/, final/, branches/, train_log.json)")
    p.add_argument("--data", default=None, help="token corpus folder (from `diffquant sample`); default: the calib "
                   "train split. With a corpus, validation is the real cased TinyStories sample")
    p.add_argument("--teacher", default=None, help="a teacher checkpoint: train on its exact samples, drawn fresh "
                   "for every step from (seed, step), never stored nor cycled (validation: real cased TinyStories). "
                   "With --data the corpus is trained on and the teacher only draws the memorisation check's "
                   "fresh stories")
    p.add_argument("--stream-cache", default=None, metavar="DIR", help="--teacher: keep the drawn blocks here, so "
                   "the other arm of a pair reads them instead of sampling again")
    p.add_argument("--stream-block-tokens", type=int, default=None, help="--teacher: tokens per drawn block "
                   "(default 2^18; each block's stories come from one generator)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=None, help="default: the preset's max_seq_len")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final learning rate / peak")
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--schedule", choices=["cosine", "linear", "constant", "wsd"], default="cosine",
                   help="wsd: warm-up, stable, linear decay over the last --cooldown-frac (or from --decay-start)")
    p.add_argument("--cooldown-frac", type=float, default=0.2)
    p.add_argument("--decay-start", type=int, default=None, help="wsd: the step the decay starts")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--recipe", choices=["stories260k"], default=None,
                   help="stories260k: AdamW lr 1e-3, betas (0.9, 0.99), weight decay 0.01 (flags given win)")
    p.add_argument("--init", choices=["normal", "default"], default="normal",
                   help="normal: N(0, 0.02) GPT-2 style; default: PyTorch's Linear init (the official Diff code)")
    p.add_argument("--lambda-init", type=float, default=None, help="Diff: a constant λ_init in every layer")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--device", default="cpu")
    p.add_argument("--attn-impl", default="sdpa", choices=ATTN_IMPLS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-tokens", type=int, default=65536)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--branch-every", type=int, default=0, help="keep a resumable state every N steps (cooldowns)")
    p.add_argument("--branch-from", default=None, help="start from RUN/branches/stepN (a cooldown branch)")
    p.add_argument("--track-every", type=int, default=0, help="log per-layer outliers every N steps")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                   help="end after this step with the resumable state saved (the schedule is still --tokens'; "
                        "continue with --resume)")
    p.add_argument("--init-from", default=None, help="start from this checkpoint's weights (train further)")
    p.set_defaults(func=run)


RECIPES = {"stories260k": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.01}}


def _recipe_values(args: argparse.Namespace, argv: list[str]) -> dict:
    """The recipe's optimizer settings, except those the user set explicitly on the command line."""
    chosen = RECIPES.get(args.recipe, {})
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    return {k: v for k, v in chosen.items() if f"--{k.replace('_', '-')}" not in given}


def run(args: argparse.Namespace) -> int:
    import torch

    from ..config import ModelConfig
    from ..train import TrainConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    _stop_on_signals()
    overrides = {"attn_impl": args.attn_impl}
    if args.lambda_init is not None:
        overrides["lambda_init"] = args.lambda_init
    model_cfg = dataclasses.replace(ModelConfig.preset(args.preset, arch=args.arch), **overrides)
    model_cfg = _fit_calib_vocab(model_cfg, args)
    opt = {k: getattr(args, k) for k in ("lr", "beta1", "beta2", "weight_decay")}
    opt.update(_recipe_values(args, args.argv))  # the arguments parsed, also when cli.main(argv) runs in-process
    cfg = TrainConfig(
        tokens=args.tokens, batch_size=args.batch_size, seq_len=args.seq_len or model_cfg.max_seq_len,
        min_lr_ratio=args.min_lr_ratio, warmup_steps=args.warmup_steps, schedule=args.schedule,
        decay_start=args.decay_start, cooldown_frac=args.cooldown_frac, bf16=args.bf16, device=args.device,
        seed=args.seed, eval_every=args.eval_every, eval_tokens=args.eval_tokens, save_every=args.save_every,
        init=args.init, branch_every=args.branch_every, track_every=args.track_every, **opt,
    )
    if cfg.seq_len > model_cfg.max_seq_len:
        raise UserError(f"--seq-len {cfg.seq_len} exceeds the preset's max_seq_len {model_cfg.max_seq_len}")
    train_ids, val_ids, provenance, files = _data(args, model_cfg, cfg)
    fresh = _fresh_stream(args, cfg)  # a streamed run draws its fresh stories from its own stream
    provenance["command"] = "diffquant " + " ".join(args.argv)
    # Outlier-regime models (logits in the hundreds) fill softmax and its gradients with denormals, which run
    # 2-3x slower on x86; flushing them to zero moves nothing above 1.2e-38 (the log header records it).
    torch.set_flush_denormal(True)
    try:
        record = train(model_cfg, cfg, args.out, train_ids, val_ids, resume=args.resume, init_from=args.init_from,
                       provenance=provenance, branch_from=args.branch_from, files=files, stop_at=args.stop_at,
                       fresh=fresh)
    finally:
        torch.set_flush_denormal(False)  # torch's default, for a caller that runs this in-process
    val = record["history"]["val"]
    print(json.dumps({"out": str(args.out), "steps": record["step"], "tokens": record["tokens_seen"],
                      "validation_loss": val[-1]["loss"] if val else None}, indent=2))
    return 0


def _stop_on_signals() -> None:
    """SIGTERM and SIGINT end training as Ctrl-C does: the state is saved at the current step. A job started
    in the background of a script (long.sh's ``&``) ignores SIGINT, and ``kill`` sends SIGTERM."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


# presets whose vocabulary is a placeholder (tiny: 128 byte ids for unit tests), not part of the model's shape
WIDENED_PRESETS = ("tiny",)


def _fit_calib_vocab(model_cfg, args: argparse.Namespace):
    """On the calib train split the project tokenizer sets the vocabulary of ``tiny`` (128 -> 8192, with a
    warning); presets shaped after a tokenizer (xs, s: stories260K's 512) and corpora (--data) keep theirs."""
    if args.data is not None or args.teacher is not None or args.preset not in WIDENED_PRESETS:
        return model_cfg
    from ..tokenizer import default_tokenizer

    vocab = default_tokenizer().vocab_size
    if vocab <= model_cfg.vocab_size:
        return model_cfg
    log.warning("preset %r has %d tokens; the calib split's tokenizer has %d: training with vocab_size %d",
                args.preset, model_cfg.vocab_size, vocab, vocab)
    return dataclasses.replace(model_cfg, vocab_size=vocab)


def _stream(args: argparse.Namespace, cfg, model_cfg=None):
    """The teacher's token stream for this run's seed and batch shape."""
    from ..stream import DEFAULT_BLOCK_TOKENS, TokenStream

    stream = TokenStream(args.teacher, cfg.seed, cfg.batch_size, cfg.seq_len, device=args.device,
                         cache_dir=args.stream_cache,
                         block_tokens=args.stream_block_tokens or DEFAULT_BLOCK_TOKENS)
    if model_cfg is not None and stream.vocab_size > model_cfg.vocab_size:
        raise UserError(f"teacher {args.teacher} has {stream.vocab_size} tokens but preset {args.preset!r} only "
                        f"{model_cfg.vocab_size}")
    return stream


def _fresh_stream(args: argparse.Namespace, cfg):
    """With --data and --teacher: the teacher that draws the memorisation check's fresh stories."""
    return _stream(args, cfg) if args.teacher and args.data is not None else None


def _data(args: argparse.Namespace, model_cfg, cfg) -> tuple:
    """(train ids or stream, validation ids, provenance, files to ship in checkpoints) for the chosen data."""
    if args.teacher is not None and args.data is None:
        from ..corpus import heldout_ids
        from ..tokenizer import tokenizer_file_name

        stream = _stream(args, cfg, model_cfg)
        tok = stream.tokenizer
        return stream, heldout_ids(tok), {"teacher": args.teacher, "validation": "tinystories-cased"}, \
            {tokenizer_file_name(tok): Path(tok.path)}
    if args.data is None:
        from ..tokenizer import default_tokenizer
        from ..train import split_tokens

        tok = default_tokenizer()
        if tok.vocab_size > model_cfg.vocab_size:
            raise UserError(f"the calib split's tokenizer has {tok.vocab_size} tokens but preset {args.preset!r} only "
                            f"{model_cfg.vocab_size}; train it on a token corpus (--data, see `diffquant sample`)")
        train_ids, train_info = split_tokens("train")
        val_ids, val_info = split_tokens("validation")
        return train_ids, val_ids, {**train_info, **val_info}, None
    from ..corpus import heldout_ids, load_corpus
    from ..tokenizer import Tokenizer

    corpus = load_corpus(args.data, vocab_size=model_cfg.vocab_size)
    if corpus.tokenizer_path is None:
        raise UserError(f"corpus {args.data} has no tokenizer file beside its shards")
    tok = Tokenizer.load(corpus.tokenizer_path)
    val_ids = heldout_ids(tok)
    provenance = {"corpus": str(args.data), "corpus_tokens": int(corpus.ids.size),
                  "corpus_shards_sha256": [s["sha256"] for s in corpus.manifest["shards"]],
                  "teacher_sha256": corpus.manifest.get("teacher_sha256"), "validation": "tinystories-cased"}
    return corpus.ids, val_ids, provenance, {corpus.tokenizer_path.name: corpus.tokenizer_path}
