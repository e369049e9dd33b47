"""`diffquant convert SRC OUT --to hf | --to gguf | --from hf`: our checkpoints <-> Hugging Face Llama / DiffLlama
folders (compressed-tensors folders for RTN / GPTQ checkpoints), and Llama models to GGUF files for llama.cpp."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from ..checkpoint import atomic_folder, check_writable, load_checkpoint, read_metadata, save_checkpoint
from ..checkpoint.hf import ARCHITECTURES, is_hf_folder, load_hf, save_hf
from ..compressed import DENSE_KEY, save_compressed
from ..errors import UserError
from ..gguf_export import GGUF_TYPES, save_gguf
from ..quant.api import is_quantized
from ..tokenizer import TOKENIZER_FILES, tokenizer_for

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert a checkpoint to or from a Hugging Face folder, or to a GGUF file",
                       epilog="examples: diffquant convert Q OUT --to hf (a packed RTN/GPTQ folder Q becomes a "
                              "compressed-tensors folder); "
                              "diffquant convert m.gguf m-q4.gguf --to gguf --gguf-type q4_0")
    p.add_argument("source", help="checkpoint folder, packed quantized folder or .gguf file (--to), or an HF folder "
                                  "(--from hf)")
    p.add_argument("out", nargs="?", action=_Positional, default=None,
                   help="output folder (hf, diffquant) or .gguf file (or --out)")
    p.add_argument("--out", dest="out", default=None, help="output folder (hf, diffquant) or .gguf file")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", choices=["hf", "gguf"],
                     help="hf: an HF folder (Transformer -> Llama, Diff -> DiffLlama; quantized checkpoints as "
                          "compressed-tensors); gguf: a llama.cpp file (Transformer only)")
    way.add_argument("--from", dest="from_", choices=["hf"], help="read an HF Llama / DiffLlama folder")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="tensor dtype (default: keep)")
    p.add_argument("--tokenizer", default=None, help="tokenizer to ship (--to hf; default: the checkpoint's)")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, default=None,
                   help="--to gguf: f32 / f16, or q8_0 / q4_0 blocks: a float source is rounded by llama.cpp's "
                        "quantizer, a quantized source keeps its own codes (refused where the format cannot hold "
                        "them) (default: f32 for float sources; required for quantized ones)")
    p.add_argument("--embeddings", action="store_true",
                   help="--to gguf q8_0/q4_0 of a float source: also quantize the embedding and output head")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder or file")
    p.set_defaults(func=run, trailing_positional="out")


class _Positional(argparse.Action):
    """The old positional OUT: an absent one leaves ``--out``'s value alone."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is not None:
            setattr(namespace, self.dest, values)


def run(args: argparse.Namespace) -> int:
    if not args.out:
        raise UserError("give the output: --out PATH (a folder, or a .gguf file for --to gguf)")
    out = Path(args.out)
    check_writable(out, args.overwrite, hint="pass --overwrite to replace it")  # before the conversion's work
    dtype = DTYPES[args.dtype] if args.dtype else None
    if args.to != "gguf" and (args.gguf_type or args.embeddings):
        raise UserError("--gguf-type and --embeddings go with --to gguf")
    if args.to == "gguf":
        summary = _to_gguf(args, out)
    else:
        summary = _to_hf(args, out, dtype) if args.to else _from_hf(args, out, dtype)
    print(json.dumps(summary))
    return 0


def _to_hf(args, out: Path, dtype) -> dict:
    model = load_checkpoint(args.source)
    tok = _shipped_tokenizer(args)
    dense = None
    if is_quantized(model):  # RTN / GPTQ codes as they are, in the format transformers and vLLM load
        save_compressed(model, out, tokenizer=tok, overwrite=args.overwrite, dtype=dtype)
        dense = json.loads(read_metadata(out).get(DENSE_KEY, "[]"))
    else:
        save_hf(model, out, tokenizer=tok, overwrite=args.overwrite, dtype=dtype)
    return {"source": str(args.source), "out": str(out), "format": "hf",
            "architecture": ARCHITECTURES[model.config.arch][1], "tokenizer": tok is not None,
            "quantization": "compressed-tensors" if is_quantized(model) else None,
            **({"held_dense": dense} if dense else {})}


def _to_gguf(args, out: Path) -> dict:
    if args.dtype:
        raise UserError("--dtype does not apply to --to gguf; choose --gguf-type")
    model = load_checkpoint(args.source)
    quantized = is_quantized(model)
    if quantized and args.gguf_type is None:
        raise UserError(f"{args.source} is quantized: pass --gguf-type q8_0 or q4_0 (its own codes) or f32 / f16 "
                        "(its dequantized weights)")
    if quantized and args.embeddings:
        raise UserError("--embeddings quantizes a float source; a quantized source keeps its own choice")
    source = Path(args.source)
    vocab_from = source if source.suffix == ".gguf" and not args.tokenizer else None
    tok = None if vocab_from is not None else _shipped_tokenizer(args)
    types = save_gguf(model, out, args.gguf_type or "f32", tokenizer=tok, vocab_from=vocab_from,
                      embeddings=args.embeddings, overwrite=args.overwrite)
    counts = {kind: sum(t == kind for t in types.values()) for kind in sorted(set(types.values()))}
    return {"source": str(source), "out": str(out), "format": "gguf", "gguf_type": args.gguf_type or "f32",
            "codes": "ours" if quantized and args.gguf_type in ("q8_0", "q4_0") else None, "tensor_types": counts,
            "vocabulary": vocab_from is not None or tok is not None}


def _shipped_tokenizer(args):
    """The tokenizer written with the model (:func:`tokenizer_for`); without --tokenizer, a source that has
    none that fits is converted without one (a note says so)."""
    try:
        return tokenizer_for(args.source, args.tokenizer)
    except UserError as err:
        if args.tokenizer:
            raise
        print(f"diffquant: note: {err}; no tokenizer written", file=sys.stderr)
        return None


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
