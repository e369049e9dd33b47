"""`diffquant convert SRC OUT --to hf | --from hf`: our checkpoints <-> Hugging Face Llama / DiffLlama folders."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from ..checkpoint import atomic_folder, check_writable, load_checkpoint, save_checkpoint
from ..checkpoint.hf import ARCHITECTURES, is_hf_folder, load_hf, save_hf
from ..errors import UserError
from ..tokenizer import TOKENIZER_FILES, Tokenizer, tokenizer_for

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert a checkpoint to or from a Hugging Face Llama / DiffLlama folder")
    p.add_argument("source", help="checkpoint folder or .gguf file (--to hf), or an HF folder (--from hf)")
    p.add_argument("out", help="output folder")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", choices=["hf"], help="write an HF folder (Transformer -> Llama, Diff -> DiffLlama)")
    way.add_argument("--from", dest="from_", choices=["hf"], help="read an HF Llama / DiffLlama folder")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="tensor dtype (default: keep)")
    p.add_argument("--tokenizer", default=None, help="tokenizer to ship (--to hf; default: the checkpoint's)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_writable(out, args.overwrite, hint="pass --overwrite to replace it")  # before the conversion's work
    dtype = DTYPES[args.dtype] if args.dtype else None
    summary = _to_hf(args, out, dtype) if args.to else _from_hf(args, out, dtype)
    print(json.dumps(summary))
    return 0


def _to_hf(args, out: Path, dtype) -> dict:
    model = load_checkpoint(args.source)
    tok = Tokenizer.load(args.tokenizer) if args.tokenizer else tokenizer_for(args.source)
    if tok.vocab_size > model.config.vocab_size:
        if args.tokenizer:
            raise UserError(f"tokenizer {args.tokenizer} has {tok.vocab_size} tokens; the model only "
                            f"{model.config.vocab_size}")
        print(f"diffquant: note: {tok.path} ({tok.vocab_size} tokens) does not fit the model's vocabulary "
              f"({model.config.vocab_size}); no tokenizer written", file=sys.stderr)
        tok = None
    save_hf(model, out, tokenizer=tok, overwrite=args.overwrite, dtype=dtype)
    return {"source": str(args.source), "out": str(out), "format": "hf",
            "architecture": ARCHITECTURES[model.config.arch][1], "tokenizer": tok is not None}


def _from_hf(args, out: Path, dtype) -> dict:
    src = Path(args.source)
    if not (src.is_dir() and is_hf_folder(src)):
        raise UserError(f"{src} is not a Hugging Face model folder (config.json with model_type)")
    model = load_hf(src)
    with atomic_folder(out, args.overwrite) as tmp:
        save_checkpoint(model, tmp, dtype=dtype)
        copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
        for name in copied:  # tokenizer_for(out) then finds the model's own tokenizer
            shutil.copyfile(src / name, tmp / name)
    return {"source": str(src), "out": str(out), "format": "diffquant", "arch": model.config.arch,
            "tokenizer": copied}
