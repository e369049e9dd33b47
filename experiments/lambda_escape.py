"""When each Diff layer's λ leaves its design range [0, 1] in training, and the warm-up loss spike that may start it,
read from the runs' train logs alone (λ is tracked with the outliers, every 128 steps; no checkpoint needed).

    python experiments/lambda_escape.py [RUN ...] [--out experiments/results/regime/lambda_escape.json]

Each RUN is a Diff arm's folder holding ``train_log.json`` (a stable arm: cooldowns continue its λ); with none,
every Diff arm of the campaign (long, streamed, ablation, short and real-text runs). Prints one markdown row per
run: the largest training loss in the first two warm-ups against the first step's, the same for the Transformer
trained beside it (which shows whether a spike is Diff's own), and for each layer that leaves [0, 1] the first
tracked step outside it and λ there and at the last tracked step. λ > 1 makes Diff subtract more than the whole
second map; λ < 0 adds it (``study.gate.lambda_ranges``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diffquant.io import atomic_write_text, dump_json, read_json_file
from diffquant.tables import render

CAMPAIGN = Path(__file__).resolve().parent / "campaign"
DIFF_ARMS = ("long/*/diff", "streamed/*/diff", "ablation/*/diff", "short/diff-*", "realtext/diff-*")
SPIKE = 1.5  # a warm-up loss this many times the first step's counts as a spike (the loss starts at ~ln vocab)


def escapes(points: list[dict]) -> list[dict]:
    """Per layer: λ_init, the first tracked step with λ outside [0, 1] (None if never), λ there and at the end."""
    layers = []
    for i, first in enumerate(points[0]["layers"]):
        curve = [(p["step"], p["layers"][i]["lambda"]) for p in points]
        left = next(((step, value) for step, value in curve if not 0.0 <= value <= 1.0), (None, None))
        layers.append({"layer": i, "lambda_init": first["lambda_init"], "left_at_step": left[0],
                       "lambda_then": left[1], "lambda_last": curve[-1][1]})
    return layers


def warmup_spike(losses: list[float], warmup_steps: int) -> dict:
    """The largest training loss in the first 2 × ``warmup_steps`` steps (the step after the peak included), its
    step, and whether it reaches ``SPIKE`` times the first step's loss."""
    window = losses[:2 * warmup_steps]
    step = max(range(len(window)), key=window.__getitem__)
    return {"first_loss": losses[0], "max_loss": window[step], "max_step": step,
            "spike": window[step] >= SPIKE * losses[0]}


def run_record(log: dict, transformer_log: dict | None = None) -> dict:
    """A Diff run's λ escapes and warm-up spike, from its train log (and its Transformer's spike, where given)."""
    points = [p for p in log["history"]["outliers"] if "lambda" in p["layers"][0]]
    if not points:
        raise ValueError("no tracked λ (not a Diff arm, or trained before λ was tracked)")
    cfg = log["train_config"]
    return {"lr": cfg["lr"], "warmup_steps": cfg["warmup_steps"], "last_step": points[-1]["step"],
            "warmup": warmup_spike(log["history"]["train_loss"], cfg["warmup_steps"]), "layers": escapes(points),
            "transformer_warmup": None if transformer_log is None else warmup_spike(
                transformer_log["history"]["train_loss"], transformer_log["train_config"]["warmup_steps"])}


def paired_transformer(run: Path) -> Path:
    """The Transformer trained beside a Diff arm: RUN/transformer beside RUN/diff, or transformer-X beside diff-X."""
    return run.with_name("transformer" + run.name.removeprefix("diff"))


def spike_cell(warmup: dict | None) -> str:
    if warmup is None:
        return "-"
    return f"{warmup['max_loss']:.2f} at {warmup['max_step']}" + (" (spike)" if warmup["spike"] else "")


def escape_table(records: dict[str, dict]) -> str:
    rows = []
    for name, r in records.items():
        left = [f"L{x['layer']} at {x['left_at_step']}: {x['lambda_then']:.2f} → {x['lambda_last']:.2f}"
                for x in r["layers"] if x["left_at_step"] is not None]
        rows.append([name, f"{r['lr']:g}", r["last_step"], f"{r['warmup']['first_loss']:.2f}",
                     spike_cell(r["warmup"]), spike_cell(r["transformer_warmup"]), "; ".join(left) or "none"])
    header = ["run", "lr", "last tracked step", "first loss", f"warm-up loss max (spike: ≥ {SPIKE:g}× the first)",
              "its Transformer's", "layers leaving [0, 1]: first step, λ then → last"]
    return render(header, rows)


def run_name(run: Path) -> str:
    """A run's folder under experiments/campaign/ (given relative or absolute), else as given."""
    full = run.resolve()
    return str(full.relative_to(CAMPAIGN) if full.is_relative_to(CAMPAIGN) else run)


def campaign_arms() -> list[Path]:
    return sorted(p for pattern in DIFF_ARMS for p in CAMPAIGN.glob(pattern) if (p / "train_log.json").is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="Diff arm folders (default: every campaign Diff arm)")
    parser.add_argument("--out", type=Path, help="also write the records as JSON here")
    args = parser.parse_args(argv)
    records = {}
    for run in args.runs or campaign_arms():
        name = run_name(run)
        try:
            beside = paired_transformer(run) / "train_log.json"
            records[name] = run_record(read_json_file(run / "train_log.json"),
                                       read_json_file(beside) if beside.is_file() else None)
        except ValueError as error:  # read_json_file: a missing, damaged or invalid file, said in one line
            sys.exit(f"lambda_escape.py: {run}: {error}")
        except KeyError as error:
            sys.exit(f"lambda_escape.py: {run}: not a train log (no {error})")
    print(escape_table(records))
    if args.out:
        atomic_write_text(args.out, dump_json(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
