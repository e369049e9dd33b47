"""Where the campaign's runs stand: each arm's stable step, its branches, which are cooled, and the steps left.

    python experiments/campaign/status.py [--root experiments/campaign]

Reads only the runs' own files (``ARCH/state/trainer.json``, ``ARCH/branches/``, ``cooldown/ARCH-stepN/``) of the
long runs (long.sh) and the ablations (ablation.sh), and prints a markdown table. No time estimate: a run's
wall clock mixes machines and loads (an xs arm takes ~0.75 s a step on one core of the 2-core CI machine).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diffquant.config import ARCHS

CAMPAIGN = Path(__file__).resolve().parent
ROOTS = ("long", "ablation")


def branch_steps(run: Path, arch: str) -> list[int]:
    return sorted(int(p.name.removeprefix("step")) for p in (run / arch / "branches").glob("step*"))


def cooldown_state(run: Path, arch: str, step: int) -> str:
    """'done', 'running' (a resumable state) or '' for the cooldown of branch ``step``."""
    out = run / "cooldown" / f"{arch}-step{step:06d}"
    if (out / "final" / "model.safetensors").is_file():
        return "done"
    return "running" if (out / "state" / "trainer.json").is_file() else ""


def arm_status(run: Path, arch: str) -> dict | None:
    """The stable phase of one arm: steps done and planned, tokens per step, branches and their cooldowns."""
    state = run / arch / "state" / "trainer.json"
    if not state.is_file():
        return None
    meta = json.loads(state.read_text())
    cfg = meta["train_config"]
    step, per_step = meta["step"], cfg["batch_size"] * cfg["seq_len"]
    cooldowns = {b: cooldown_state(run, arch, b) for b in branch_steps(run, arch)}
    return {"run": run.name, "arch": arch, "step": step, "steps": cfg["tokens"] // per_step,
            "tokens_per_step": per_step,
            "cooled": [b for b, c in cooldowns.items() if c == "done"],
            "cooling": [b for b, c in cooldowns.items() if c == "running"],
            "uncooled": [b for b, c in cooldowns.items() if not c]}


def campaign_status(root: Path) -> list[dict]:
    rows = []
    for kind in ROOTS:
        for run in sorted(p for p in (root / kind).glob("*") if p.is_dir()):
            rows += [row for arch in ARCHS if (row := arm_status(run, arch))]
    return rows


def millions(steps: int, per_step: int) -> str:
    return f"{steps * per_step / 1e6:.1f}M"


def cooled_budgets(branches: list[int], per_step: int) -> str:
    """The budgets the cooldowns of these branches end at (cooldown.sh: N/4 more steps after branch N)."""
    return ", ".join(millions(b + b // 4, per_step) for b in branches) or "-"


def table(rows: list[dict]) -> str:
    lines = ["| run | arm | stable step | of | cooled at (tokens) | cooling | branch not cooled | steps left |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['arch']} | {r['step']} ({millions(r['step'], r['tokens_per_step'])}) | "
                     f"{r['steps']} | {cooled_budgets(r['cooled'], r['tokens_per_step'])} | "
                     f"{cooled_budgets(r['cooling'], r['tokens_per_step'])} | "
                     f"{', '.join(map(str, r['uncooled'])) or '-'} | {r['steps'] - r['step']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=CAMPAIGN, help="the folder holding long/ and ablation/")
    print(table(campaign_status(parser.parse_args().root)))


if __name__ == "__main__":
    main()
