"""Where the campaign's runs stand: each arm's stable step, its latest tracked outliers, its branches, which are
cooled, how far each running cooldown has got (its last saved step), and the steps left.

    python experiments/campaign/status.py [--root experiments/campaign]

Reads only the runs' own files (``ARCH/state/trainer.json``, ``ARCH/train_log.json``, ``ARCH/branches/``,
``cooldown/ARCH-stepN/``) of the long runs (long.sh), the ablations (ablation.sh) and the streamed runs
(streamed.sh), and prints a markdown table. No time estimate: a run's wall clock mixes machines and loads (an xs
arm takes ~0.75 s a step on one core of the 2-core CI machine).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diffquant.config import ARCHS
from diffquant.emergence import tracked_curve

CAMPAIGN = Path(__file__).resolve().parent
ROOTS = ("long", "ablation", "streamed")


def branch_steps(run: Path, arch: str) -> list[int]:
    return sorted(int(p.name.removeprefix("step")) for p in (run / arch / "branches").glob("step*"))


def cooldown(run: Path, arch: str, step: int) -> tuple[str, int, int]:
    """('done' | 'running' | '', the token budget it ends at, the step it has reached) for the cooldown of branch
    ``step``; both are read from the cooldown's own log (done) or resumable state (running), so no rule of
    cooldown.sh is restated."""
    out = run / "cooldown" / f"{arch}-step{step:06d}"
    if (out / "final" / "config.json").is_file():  # weights may be parked (states.json)
        state, record = "done", out / "train_log.json"
    elif (out / "state" / "trainer.json").is_file():
        state, record = "running", out / "state" / "trainer.json"
    else:
        return "", 0, 0
    meta = json.loads(record.read_text())
    return state, meta["train_config"]["tokens"], meta["step"]


def latest_tracked(run: Path, arch: str) -> tuple[float | None, float | None]:
    """The stable arm's last tracked (logit top-1, hidden top-1), maxima over layers: whether it is heading for
    the gate (logit top-1 >= 100) before a cooldown says so."""
    log = run / arch / "train_log.json"
    curve = tracked_curve(json.loads(log.read_text())) if log.is_file() else []
    return curve[-1][1:] if curve else (None, None)


def arm_status(run: Path, arch: str) -> dict | None:
    """The stable phase of one arm: steps done and planned, tokens per step, branches and their cooldowns
    (cooled: the budgets they end at; cooling: (that budget, the step reached); uncooled: the branch steps)."""
    state = run / arch / "state" / "trainer.json"
    if not state.is_file():
        return None
    meta = json.loads(state.read_text())
    cfg = meta["train_config"]
    step, per_step = meta["step"], cfg["batch_size"] * cfg["seq_len"]
    cooldowns = {b: cooldown(run, arch, b) for b in branch_steps(run, arch)}
    return {"run": run.name, "arch": arch, "step": step, "steps": cfg["tokens"] // per_step,
            "tokens_per_step": per_step, "tracked": latest_tracked(run, arch),
            "cooled": [tokens for c, tokens, _ in cooldowns.values() if c == "done"],
            "cooling": [(tokens, at) for c, tokens, at in cooldowns.values() if c == "running"],
            "uncooled": [b for b, (c, _, _) in cooldowns.items() if not c]}


def campaign_status(root: Path) -> list[dict]:
    rows = []
    for kind in ROOTS:
        for run in sorted(p for p in (root / kind).glob("*") if p.is_dir()):
            rows += [row for arch in ARCHS if (row := arm_status(run, arch))]
    return rows


def millions(tokens: list[int]) -> str:
    return ", ".join(f"{t / 1e6:.1f}M" for t in tokens) or "-"


def cooling(runs: list[tuple[int, int]], tokens_per_step: int) -> str:
    return ", ".join(f"{millions([t])} (step {at} of {t // tokens_per_step})" for t, at in runs) or "-"


def maxima(tracked: tuple[float | None, float | None]) -> str:
    return " / ".join("-" if v is None else f"{v:.1f}" for v in tracked)


def table(rows: list[dict]) -> str:
    lines = ["| run | arm | stable step | of | tracked logit / hidden top-1 | cooled at (tokens) | cooling | "
             "branch not cooled | steps left |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['arch']} | {r['step']} ({millions([r['step'] * r['tokens_per_step']])}) | "
                     f"{r['steps']} | {maxima(r['tracked'])} | {millions(r['cooled'])} | "
                     f"{cooling(r['cooling'], r['tokens_per_step'])} | "
                     f"{', '.join(map(str, r['uncooled'])) or '-'} | {r['steps'] - r['step']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=CAMPAIGN, help="the folder holding long/, ablation/ and streamed/")
    print(table(campaign_status(parser.parse_args().root)))


if __name__ == "__main__":
    main()
