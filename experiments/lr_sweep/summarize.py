"""Summarise the LR sweep: one JSON record per run, then the table and the two figures from the records.

    python experiments/lr_sweep/summarize.py [--runs experiments/lr_sweep/runs] [--out experiments/results]

Per run: final validation loss on the real cased TinyStories text (the trainer's windows), and a profile of the
final checkpoint over the first 64 windows of 512 held-out tokens (attention-logit and hidden-state top-1 and
median, where the top-1 sits). The teacher (stories260K) is scored on the same windows: the student-teacher gap.
Writes lr_sweep.json (records), lr_sweep.md (table), lr_sweep.png (LR on the x axis) and emergence.png
(tracked per-layer maxima against training tokens). A run whose final weights are parked in main's history
(experiments/campaign/states.json) keeps its record from the lr_sweep.json already there.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from diffquant import load_checkpoint, profile  # noqa: E402
from diffquant.checkpoint.files import weights_here  # noqa: E402
from diffquant.checkpoint.gguf import stories260k_path, stories260k_tokenizer_path  # noqa: E402
from diffquant.corpus import heldout_ids  # noqa: E402
from diffquant.emergence import max_over_layers  # noqa: E402
from diffquant.io import atomic_write_text  # noqa: E402
from diffquant.quant import ActQuant, QuantConfig, quantize_model  # noqa: E402
from diffquant.study.gate import GATE_LOGIT_TOP1, GATE_PPL_FACTOR  # noqa: E402
from diffquant.tokenizer import Tokenizer  # noqa: E402
from diffquant.train import eval_windows, mean_loss  # noqa: E402

RUN_NAME = re.compile(r"(?P<arch>transformer|diff)-lr(?P<lr>[0-9.e-]+)-s(?P<seed>\d+)$")
PROFILE_WINDOWS = 64
ARCH_STYLE = {"transformer": ("tab:blue", "-"), "diff": ("tab:red", "--")}


def heldout_windows(seq_len: int = 512, eval_tokens: int = 65536) -> torch.Tensor:
    return eval_windows(heldout_ids(Tokenizer.load(stories260k_tokenizer_path())), seq_len, eval_tokens)


def logit4_loss(model, windows: torch.Tensor) -> float:
    """Validation loss with every attention logit fake-quantized to 4 bits, one absmax scale per sequence."""
    quantized = quantize_model(model, QuantConfig(logits=ActQuant(bits=4, granularity="sequence")))
    return mean_loss(quantized, windows, 16, "cpu")


def run_record(run: Path, windows: torch.Tensor, previous: dict[str, dict]) -> dict | None:
    m = RUN_NAME.match(run.name)
    log_file = run / "train_log.json"
    if not m or not log_file.is_file() or not (run / "final").is_dir():
        return None
    if not weights_here(run / "final"):
        if run.name not in previous:
            raise SystemExit(f"{run}/final has no weights here and no earlier record: restore them with "
                             f"bash experiments/campaign/restore_states.sh {run}/final")
        return previous[run.name]
    log = json.loads(log_file.read_text())
    model = load_checkpoint(run / "final")
    rep = profile(model, list(windows[:PROFILE_WINDOWS, :-1].split(16)), sites=("attn_logits", "hidden"), topk=10,
                  n_locations=1, progress=False).data["sites"]
    hist = log["history"]
    return {
        "run": run.name, "arch": m["arch"], "lr": float(m["lr"]), "seed": int(m["seed"]),
        "tokens": log["tokens_seen"], "parameters": log["parameters"],
        "val_loss": hist["val"][-1]["loss"], "wall_s": hist["wall_s"],
        "logit4_ppl_ratio": math.exp(logit4_loss(model, windows[:PROFILE_WINDOWS]) - mean_loss(
            model, windows[:PROFILE_WINDOWS], 16, "cpu")),
        "train_tokens_per_s": log["tokens_seen"] / hist["wall_s"] if hist["wall_s"] else None,
        "logit_top1": rep["attn_logits"]["top"][0], "logit_median": rep["attn_logits"]["median"],
        "logit_top1_at": rep["attn_logits"]["locations"][0],
        "hidden_top1": rep["hidden"]["top"][0], "hidden_median": rep["hidden"]["median"],
        "hidden_top1_at": rep["hidden"]["locations"][0],
        "emergence": [{"tokens": p["tokens"], "logit_top1": max_over_layers(p["layers"], "attn_logits"),
                       "hidden_top1": max_over_layers(p["layers"], "hidden"),
                       "lambda": [layer.get("lambda") for layer in p["layers"]]} for p in hist.get("outliers", [])],
    }


def teacher_record(windows: torch.Tensor) -> dict:
    teacher = load_checkpoint(stories260k_path(), attn_impl="sdpa")
    rep = profile(teacher, list(windows[:PROFILE_WINDOWS, :-1].split(16)), sites=("attn_logits", "hidden"), topk=10,
                  n_locations=1, progress=False).data["sites"]
    loss = mean_loss(teacher, windows, 16, "cpu")
    four = logit4_loss(teacher, windows[:PROFILE_WINDOWS]) - mean_loss(teacher, windows[:PROFILE_WINDOWS], 16, "cpu")
    return {"run": "teacher (stories260K)", "val_loss": loss, "logit4_ppl_ratio": math.exp(four),
            "logit_top1": rep["attn_logits"]["top"][0], "hidden_top1": rep["hidden"]["top"][0]}


def table(records: list[dict], teacher: dict) -> str:
    lines = ["| peak LR | arch | seeds | val loss | gap to teacher | logit top-1 | hidden top-1 | "
             "logit top-1 at (first key?) | ppl × (4-bit logits) | tokens/s |", "|---" * 10 + "|"]
    for lr in sorted({r["lr"] for r in records}):
        for arch in ("transformer", "diff"):
            rs = sorted((r for r in records if r["lr"] == lr and r["arch"] == arch), key=lambda r: r["seed"])
            if not rs:
                continue
            def per_seed(key: str, fmt: str, rs=rs) -> str:
                return " / ".join(format(r[key], fmt) for r in rs)

            first = " / ".join(f"L{r['logit_top1_at']['layer']} " + ("yes" if r["logit_top1_at"]["key"] == 0 else "no")
                               for r in rs)
            gap = " / ".join(f"{r['val_loss'] - teacher['val_loss']:+.3f}" for r in rs)
            lines.append(f"| {lr:g} | {arch} | {len(rs)} | {per_seed('val_loss', '.3f')} | {gap} | "
                         f"{per_seed('logit_top1', '.1f')} | {per_seed('hidden_top1', '.1f')} | {first} | "
                         f"{per_seed('logit4_ppl_ratio', '.3f')} | {per_seed('train_tokens_per_s', '.0f')} |")
    lines.append(f"| — | teacher | — | {teacher['val_loss']:.3f} | 0 | {teacher['logit_top1']:.1f} | "
                 f"{teacher['hidden_top1']:.1f} | | {teacher['logit4_ppl_ratio']:.3f} | |")
    return "\n".join(lines)




def gate(record: dict) -> bool:
    return record["logit_top1"] >= GATE_LOGIT_TOP1 and record["logit4_ppl_ratio"] >= GATE_PPL_FACTOR


def ratios(records: list[dict]) -> str:
    """Transformer / Diff per (lr, seed): the paper's direction is ratio > 1; and the Transformer's gate."""
    out = ["| peak LR | seed | logit top-1 T/D | hidden top-1 T/D | ppl × 4-bit logits T / D | val loss D − T | "
           f"gate (T top-1 ≥ {GATE_LOGIT_TOP1:g} and ppl × ≥ {GATE_PPL_FACTOR:g}) |", "|---" * 7 + "|"]
    by = {(r["lr"], r["seed"], r["arch"]): r for r in records}
    for lr, seed in sorted({(r["lr"], r["seed"]) for r in records}):
        t, d = by.get((lr, seed, "transformer")), by.get((lr, seed, "diff"))
        if t and d:
            out.append(f"| {lr:g} | {seed} | {t['logit_top1'] / d['logit_top1']:.2f} | "
                       f"{t['hidden_top1'] / d['hidden_top1']:.2f} | "
                       f"{t['logit4_ppl_ratio']:.3f} / {d['logit4_ppl_ratio']:.3f} | "
                       f"{d['val_loss'] - t['val_loss']:+.3f} | {'yes' if gate(t) else 'no'} |")
    return "\n".join(out)


def plot_lr(records: list[dict], teacher: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, title in zip(axes, ("val_loss", "logit_top1", "hidden_top1"),
                              ("validation loss (real TinyStories)", "attention-logit top-1", "hidden-state top-1"),
                              strict=True):
        for arch, (color, style) in ARCH_STYLE.items():
            rs = [r for r in records if r["arch"] == arch]
            lrs = sorted({r["lr"] for r in rs})
            if not lrs:
                continue
            means = [statistics.mean(r[key] for r in rs if r["lr"] == lr) for lr in lrs]
            ax.plot(lrs, means, style, color=color, marker="o", label=f"{arch} (mean of seeds)")
            ax.scatter([r["lr"] for r in rs], [r[key] for r in rs], color=color, s=12, alpha=0.5)
        if key == "val_loss":
            ax.axhline(teacher["val_loss"], color="gray", lw=0.8, ls=":", label="teacher")
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_emergence(records: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    lrs = sorted({r["lr"] for r in records})
    shades = {lr: 0.35 + 0.65 * i / max(1, len(lrs) - 1) for i, lr in enumerate(lrs)}
    for ax, key, title in zip(axes, ("logit_top1", "hidden_top1"),
                              ("attention-logit top-1 (max over layers)", "hidden-state top-1 (max over layers)"),
                              strict=True):
        for r in sorted(records, key=lambda r: (r["arch"], r["lr"], r["seed"])):
            color, style = ARCH_STYLE[r["arch"]]
            pts = [p for p in r["emergence"] if p[key] is not None]
            ax.plot([p["tokens"] / 1e6 for p in pts], [p[key] for p in pts], style, color=color,
                    alpha=shades[r["lr"]] * (1.0 if r["seed"] == 0 else 0.5), lw=1.2,
                    label=f"{r['arch']} lr {r['lr']:g}" if r["seed"] == 0 else None)
        ax.set_xlabel("training tokens (M)")
        ax.set_yscale("log")
        ax.set_title(title)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="experiments/lr_sweep/runs")
    parser.add_argument("--out", default="experiments/results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    windows = heldout_windows()
    out = Path(args.out)
    saved = json.loads((out / "lr_sweep.json").read_text()) if (out / "lr_sweep.json").is_file() else {"runs": []}
    previous = {r["run"]: r for r in saved["runs"]}
    records = [r for run in sorted(Path(args.runs).iterdir())
               if run.is_dir() and (r := run_record(run, windows, previous))]
    if not records:
        raise SystemExit(f"no finished runs under {args.runs}")
    diverged = sorted(f"{run.name} (step {log['history']['diverged_at']})" for run in Path(args.runs).iterdir()
                      if (run / "train_log.json").is_file()
                      and "diverged_at" in (log := json.loads((run / "train_log.json").read_text()))["history"])
    teacher = teacher_record(windows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "lr_sweep.json", json.dumps({"teacher": teacher, "runs": records, "diverged": diverged},
                                                        indent=1))
    text = table(records, teacher) + "\n\n" + ratios(records) + "\n"
    if diverged:
        text += "\nDiverged (non-finite training loss): " + ", ".join(diverged) + "\n"
    atomic_write_text(out / "lr_sweep.md", text)
    plot_lr(records, teacher, out / "lr_sweep.png")
    plot_emergence(records, out / "emergence.png")
    print(text)
    if any(math.isnan(r["val_loss"]) for r in records):
        raise SystemExit("a run has a NaN validation loss")


if __name__ == "__main__":
    main()
