"""`diffquant info CKPT`: a checkpoint's config, parameter counts and, for a quantized one, its scheme."""

from __future__ import annotations

import argparse
import json

import torch

from ..checkpoint import checkpoint_format, load_checkpoint
from ..model import build_model, num_params


def register(sub) -> None:
    p = sub.add_parser("info", help="print a checkpoint's config, parameter counts and quantization scheme")
    p.add_argument("checkpoint", help="checkpoint folder or .gguf file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load_checkpoint(args.checkpoint)  # reads and checks every tensor
    cfg = model.config
    with torch.device("meta"):  # the float model's counts: a packed model holds its codes in buffers
        skeleton = build_model(cfg)
    embed = skeleton.embed.weight.numel()
    total = num_params(skeleton)
    summary = {
        "checkpoint": str(args.checkpoint),
        "format": checkpoint_format(args.checkpoint),
        "config": cfg.to_dict(),
        "parameters": {
            "total": total,
            "embedding": embed,
            "non_embedding": total - embed,
            "per_layer": num_params(skeleton.layers[0]),
        },
        "heads": {
            "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "sub_heads_per_head": cfg.sub_heads_per_head,
        },
        "quantization": quantization_summary(args.checkpoint),
    }
    print(json.dumps(summary, indent=2))
    return 0


def quantization_summary(path) -> dict | None:
    """What a packed or compressed-tensors checkpoint quantizes (None for a float one)."""
    fmt = checkpoint_format(path)
    if fmt == "packed":
        from ..checkpoint.packed import read_quant_info
        from ..kinds import upgrade_legacy_granularities

        info = read_quant_info(path)
        config = upgrade_legacy_granularities(info.get("quant_config") or {})
        weights = config.get("weights")
        layers = sum(m.get("type") in ("QuantLinear", "QuantEmbedding") for m in info.get("modules", {}).values())
        return {"format": "diffquant packed",
                "weights": weights and {"method": weights["method"], "bits": weights["bits"],
                                        "group_size": weights.get("group_size"), "layers": layers},
                **{k: v for k, v in config.items() if k != "weights" and v is not None}}
    if fmt == "compressed":
        from ..checkpoint.compressed import compressed_scheme

        targets = compressed_scheme(path)
        schemes = {(w["num_bits"], w.get("group_size")) for w in targets.values()}
        weights = [{"method": "int (compressed-tensors pack-quantized)", "bits": bits, "group_size": group,
                    "layers": sum((w["num_bits"], w.get("group_size")) == (bits, group) for w in targets.values())}
                   for bits, group in sorted(schemes, key=str)]
        return {"format": "compressed-tensors", "weights": weights[0] if len(weights) == 1 else weights}
    return None
