"""`diffquant quantize CKPT --weights gptq --bits 4 --group-size 128 --out DIR`: a packed quantized checkpoint."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..calibration import DEFAULT_CALIB_TOKENS
from ..cliargs import act_granularity, add_device_argument, chosen_device
from ..errors import UserError
from ..kinds import ACT_GRANULARITIES, HEAD_GRANULARITIES, SEQUENCE
from ..quant import weight_methods

WEIGHT_CHOICES = [*weight_methods(), "none"]
DTYPES = ("float16", "bfloat16", "float32")


def register(sub) -> None:
    p = sub.add_parser("quantize", help="quantize a checkpoint into a packed checkpoint (weights, activations, logits)")
    p.add_argument("checkpoint", help="checkpoint folder or .gguf file")
    p.add_argument("--out", required=True, help="folder for the packed checkpoint (never the source)")
    p.add_argument("--weights", choices=WEIGHT_CHOICES, default="none", help="weight method (default: none)")
    p.add_argument("--bits", type=int, default=None, help="weight bits, 2..8 (implied by the bnb methods)")
    p.add_argument("--group-size", type=int, default=None, help="weights per scale (default: one per row)")
    p.add_argument("--asymmetric", action="store_true", help="min/max weights with zero points")
    p.add_argument("--grid", default=None, choices=["absmax", "full"],
                   help="symmetric grid: absmax (codes ±(2^(b-1)-1)) or full (GPTQ's: all 2^b levels); "
                        "default full for gptq, absmax for rtn")
    p.add_argument("--act-order", action="store_true", help="GPTQ: columns by decreasing Hessian diagonal")
    p.add_argument("--damp", type=float, default=0.01, help="GPTQ damping (fraction of the mean diagonal)")
    p.add_argument("--threshold", type=float, default=6.0, help="bnb-int8 outlier threshold")
    p.add_argument("--embeddings", action="store_true", help="also quantize the embedding and output head")
    p.add_argument("--act-bits", type=int, default=None, help="quantize every block Linear's input (2..16)")
    p.add_argument("--act-granularity", default="token", type=act_granularity, choices=["token", SEQUENCE],
                   help="token (default) or sequence")
    p.add_argument("--logit-bits", type=int, default=None, help="quantize the attention logits (2..16)")
    p.add_argument("--logit-granularity", default=SEQUENCE, type=act_granularity, choices=ACT_GRANULARITIES,
                   help=f"default {SEQUENCE} (one scale per sequence), "
                        f"{' | '.join(HEAD_GRANULARITIES)} or row / token (per query row)")
    p.add_argument("--calib-tokens", type=int, default=DEFAULT_CALIB_TOKENS, help="calibration tokens (GPTQ)")
    p.add_argument("--calib-seq-len", type=int, default=None, help="default: min(256, the model's max_seq_len)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the calibration text (default: the checkpoint's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration windows")
    p.add_argument("--dtype", default="float16", choices=DTYPES,
                   help="storage of the float tensors: unquantized weights, norms, scales (default float16)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    add_device_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..calibration import gptq_calibration
    from ..checkpoint import check_writable, load_checkpoint, save_quantized
    from ..checkpoint.packed import fp16_file_bytes
    from ..hf_native import is_native_hf
    from ..quant import QuantConfig, WeightQuant, quantize_

    source, out = Path(args.checkpoint), Path(args.out)  # the CLI refused an --out over, in or around the source
    if not source.exists():
        raise UserError(f"checkpoint {source} does not exist")
    check_writable(out, args.overwrite, hint="pass --overwrite to replace it")  # before the quantizer's work
    config = QuantConfig(
        weights=None if args.weights == "none" else WeightQuant(
            args.weights, bits=args.bits, group_size=args.group_size, symmetric=not args.asymmetric,
            grid=args.grid, act_order=args.act_order, damp=args.damp, threshold=args.threshold,
            embeddings=args.embeddings),
        activations=_act_quant(args.act_bits, args.act_granularity, "--act-bits"),
        logits=_act_quant(args.logit_bits, args.logit_granularity, "--logit-bits"),
    )
    if args.weights == "none" and (args.bits is not None or args.group_size is not None):
        raise UserError("--bits/--group-size need --weights rtn|gptq")
    if config == QuantConfig():
        raise UserError("nothing to quantize: give --weights, --act-bits or --logit-bits")
    if args.tokenizer and args.weights != "gptq":
        raise UserError("--tokenizer tokenizes GPTQ's calibration text; --weights "
                        f"{args.weights} reads no text")
    if is_native_hf(source):
        return _run_native(args, source, out, config)
    model = load_checkpoint(source, device=chosen_device(args))
    fp16_bytes = fp16_file_bytes(model)  # the float baseline, measured before quantizing in place
    start = time.perf_counter()
    calib, calib_info, tokenizer = None, {}, None
    if config.weights is not None and config.weights.handler.needs_calibration:
        calib, calib_info, tokenizer = gptq_calibration(source, model, args.calib_tokens, args.calib_seq_len,
                                                        args.seed, args.tokenizer)
    quantize_(model, config, calib=calib if calib is None else calib.to(chosen_device(args)))
    seconds = time.perf_counter() - start
    model.cpu()
    extra = _tokenizer_files(source, tokenizer)
    save_quantized(model.eval(), out, overwrite=args.overwrite, dtype=getattr(torch, args.dtype), extra_files=extra,
                   metadata={"source": str(source), "command": "diffquant " + " ".join(args.argv)})
    print(json.dumps(_summary(source, out, config, fp16_bytes, calib_info, seconds), indent=2))
    return 0


def _run_native(args: argparse.Namespace, source: Path, out: Path, config) -> int:
    """An HF folder that does not convert to ours: quantized through HFProbed, written as a float HF folder with
    the dequantized weights (see :mod:`diffquant.hf_native`)."""
    from ..calibration import gptq_calibration
    from ..hf_native import check_native, conv1d_names, load_probed_hf, save_dequantized
    from ..quant import quantize_
    from ..quant.registry import HF_DEQUANTIZED, refuse_export

    check_native(source, config.probe_targets())
    if config.activations is not None or config.logits is not None:
        raise UserError(f"{source} is an HF folder: --out holds weight quantization only (a float HF folder with "
                        "the dequantized weights); sweep activation and logit quantization with `diffquant sweep`")
    if config.weights is not None and (refusal := refuse_export(config.weights.handler, HF_DEQUANTIZED, source)):
        raise UserError(refusal)
    model = load_probed_hf(source, chosen_device(args))
    conv1d = conv1d_names(model.hf)
    start = time.perf_counter()
    calib, calib_info = None, {}
    if config.weights is not None and config.weights.handler.needs_calibration:
        calib, calib_info, _ = gptq_calibration(source, model, args.calib_tokens, args.calib_seq_len, args.seed,
                                                args.tokenizer)
    quantize_(model, config, calib=calib if calib is None else calib.to(chosen_device(args)))
    seconds = time.perf_counter() - start
    model.cpu()
    note = {"source": str(source), "command": "diffquant " + " ".join(args.argv), "quant_config": config.to_dict(),
            "format": "float HF folder, dequantized weights"}
    save_dequantized(model, out, conv1d, note, overwrite=args.overwrite, extra_files=_tokenizer_files(source, None))
    summary = {"source": str(source), "out": str(out), "quant_config": config.to_dict(),
               "format": "hf-dequantized", "seconds": round(seconds, 2), "calibration": calib_info or None}
    print(json.dumps(summary, indent=2))
    return 0


def _tokenizer_files(source: Path, tokenizer) -> dict[str, Path]:
    """Ship the source's own tokenizer beside the packed weights (the project tokenizer is found anyway)."""
    from ..tokenizer import TOKENIZER_FILES, default_tokenizer_path, tokenizer_file_name

    if source.is_dir():
        return {name: source / name for name in TOKENIZER_FILES if (source / name).is_file()}
    path = Path(tokenizer.path) if tokenizer is not None and tokenizer.path else None
    if path is None or path.resolve() == default_tokenizer_path().resolve():
        return {}
    return {tokenizer_file_name(tokenizer): path}


def _summary(source: Path, out: Path, config, fp16_bytes: int, calib_info: dict, seconds: float) -> dict:
    from ..checkpoint import WEIGHTS_FILE

    packed_bytes = (out / WEIGHTS_FILE).stat().st_size
    return {
        "source": str(source), "out": str(out), "quant_config": config.to_dict(),
        "model_safetensors_bytes": packed_bytes, "fp16_safetensors_bytes": fp16_bytes,
        "ratio_vs_fp16": round(packed_bytes / fp16_bytes, 4),
        "folder_bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file()),
        "seconds": round(seconds, 2), "calibration": calib_info or None,
    }


def _act_quant(bits: int | None, granularity: str, option: str):
    """The dynamic quantizer an option asks for (None: not given), its range error naming that option."""
    from ..quant import ActQuant

    if bits is None:
        return None
    try:
        return ActQuant(bits, granularity)
    except ValueError as err:
        raise UserError(f"{option}: {err}") from None
