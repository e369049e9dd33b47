"""GPU scale in one script: train a ≥100M-parameter matched pair in bf16, then the Table-5 and Figure-8 protocols.

    python experiments/gpu/run_gpu.py --out experiments/results/gpu           # one H200: about 8 minutes
    python experiments/gpu/run_gpu.py --dry-run --out /tmp/gpu-dry            # CPU, tiny sizes (tested in CI)

Steps, each timed and logged into ``summary.json``:
1. train the ``base`` preset (≈119M parameters) as Transformer and as Diff on the shipped corpus, same data
   order and seed, bf16 autocast, sdpa (flash-attn when installed);
2. profile 409,600 held-out tokens (Table 5 protocol) → ``table5.json`` / ``table5.md`` / ``table5.png``;
3. sweep the attention logits at 16/8/6/4 bits on the full HellaSwag validation set and WikiText-2 with
   paired intervals (Figure 8 protocol) → ``figure8.jsonl`` / ``figure8.md`` / ``figure8.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from diffquant.checkpoint import load_checkpoint
from diffquant.config import ModelConfig
from diffquant.data import documents, encode_documents
from diffquant.io import atomic_write_text
from diffquant.plots import plot_layers
from diffquant.profile import profile, token_batches
from diffquant.report import plot_degradation, read_records, render_report
from diffquant.sweep import run_sweep
from diffquant.tables import outlier_table, ratio_table
from diffquant.tokenizer import default_tokenizer
from diffquant.train import TrainConfig, split_tokens, train

FULL = {"preset": "base", "tokens": 20_000_000, "batch": 32, "seq_len": 1024, "lr": 1e-3, "profile_tokens": 409_600,
        "tasks": {"hellaswag": None, "wikitext2": None}, "device": "cuda"}
DRY = {"preset": "tiny", "tokens": 8 * 64 * 4, "batch": 8, "seq_len": 64, "lr": 3e-3, "profile_tokens": 2048,
       "tasks": {"hellaswag": 4, "wikitext2": 2}, "device": "cpu",
       "overrides": {"vocab_size": 8192}}  # the project tokenizer's vocabulary


def train_pair(plan: dict, out: Path) -> dict[str, Path]:
    train_ids, train_info = split_tokens("train")
    val_ids, _ = split_tokens("validation")
    impl = "flash" if _has_flash() and plan["device"] == "cuda" else "sdpa"
    cfg = TrainConfig(tokens=plan["tokens"], batch_size=plan["batch"], seq_len=plan["seq_len"], lr=plan["lr"],
                      bf16=plan["device"] == "cuda", device=plan["device"], warmup_steps=min(100, plan["tokens"] //
                      (plan["batch"] * plan["seq_len"]) // 5 + 1), eval_every=10**9, save_every=10**9,
                      eval_tokens=plan["seq_len"] * 64, snapshots=(1.0,))
    finals = {}
    for arch in ("transformer", "diff"):
        model_cfg = dataclasses.replace(ModelConfig.preset(plan["preset"], arch=arch, **plan.get("overrides", {})),
                                        attn_impl=impl, max_seq_len=max(plan["seq_len"], 256))
        train(model_cfg, cfg, out / f"train-{arch}", train_ids, val_ids, provenance=train_info)
        finals[arch] = out / f"train-{arch}" / "final"
    return finals


def _has_flash() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def table5(finals: dict[str, Path], plan: dict, out: Path) -> None:
    ids = encode_documents(default_tokenizer(), documents("test"))
    records = {}
    for arch, path in finals.items():
        model = load_checkpoint(path, device=plan["device"])
        batches = token_batches(ids, 256, 32, plan["profile_tokens"])
        records[arch] = profile(model, batches, label=f"{arch}-{plan['preset']}").data
    text = outlier_table({r["label"]: r for r in records.values()}, paper=True) + "\n\n" + \
        ratio_table(records["transformer"], records["diff"])
    atomic_write_text(out / "table5.json", json.dumps(records, indent=1))
    atomic_write_text(out / "table5.md", text + "\n")
    plot_layers({r["label"]: r for r in records.values()}, out / "table5.png")
    print(text)


def figure8(finals: dict[str, Path], plan: dict, out: Path) -> None:
    path = out / "figure8.jsonl"
    for task, limit in plan["tasks"].items():
        run_sweep([str(p) for p in finals.values()], path, "attn_logits", bits=(16, 8, 6, 4), tasks=[task],
                  limit=limit, batch_size=32, device=plan["device"])
    records = read_records(path)
    text = render_report(records, fmt="markdown")
    atomic_write_text(out / "figure8.md", text + "\n")
    plot_degradation(records, out / "figure8.png")
    print(text)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (what CI runs)")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else FULL
    if plan["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --dry-run, or on a GPU machine")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    start = time.time()
    finals = train_pair(plan, out)
    times["train_s"] = time.time() - start
    table5(finals, plan, out)
    times["table5_s"] = time.time() - start - times["train_s"]
    figure8(finals, plan, out)
    times["total_s"] = time.time() - start
    summary = {"plan": plan, "times": times,
               "device": torch.cuda.get_device_name() if plan["device"] == "cuda" else "cpu"}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
