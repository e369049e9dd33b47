"""The campaign's shell scripts hand the right options to `diffquant train` (a stand-in records each call)."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

CAMPAIGN = Path(__file__).resolve().parents[1] / "experiments" / "campaign"
FAKE_TRAIN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
shift  # "train"
while [ $# -gt 0 ]; do
  case $1 in --out) out=$2; shift ;; --branch-from) branch=$2; shift ;; esac
  shift
done
mkdir -p "$out/final" && touch "$out/final/model.safetensors" "$out/final/config.json"
[ -n "${branch:-}" ] || mkdir -p "$out/branches/step004096"  # a stable run keeps its branch
"""


def run_script(tmp_path: Path, script: str, fake_train: str = FAKE_TRAIN, **env: str) -> list[list[str]]:
    """Run a campaign script with RUN under tmp_path and the stand-in for `diffquant`; the train calls it made."""
    fake, calls = tmp_path / "dq", tmp_path / "calls"
    fake.write_text(fake_train)
    fake.chmod(0o755)
    script_vars = ("EXTRA", "ARMS", "TOKENS", "SEED", "PRESET", "LR", "UNTIL", "BRANCHES", "THREADS", "TEACHER",
                   "CORPUS")
    base = {k: v for k, v in os.environ.items() if k not in script_vars}
    corpus = tmp_path / "corpus"  # not the campaign's: its parked shards would be restored into the tree
    env = {**base, "DQ": str(fake), "CALLS": str(calls), "RUN": str(tmp_path / "run"), "CORPUS": str(corpus), **env}
    subprocess.run(["bash", str(CAMPAIGN / script)], env=env, check=True, capture_output=True)
    return [shlex.split(line) for line in calls.read_text().splitlines()]


def option(call: list[str], name: str) -> str:
    return call[call.index(name) + 1]


@pytest.mark.parametrize("ablation, arms, extra, env", [
    ("lambda0.8", ["diff"], ["--lambda-init", "0.8"], {}),
    ("init-default", ["transformer", "diff"], ["--init", "default"], {}),
    ("init-default", ["transformer"], ["--init", "default"], {"ARMS": "transformer"}),  # one arm at a time
])
def test_ablation_trains_to_the_first_branch_then_cools_it(tmp_path, ablation, arms, extra, env):
    calls = run_script(tmp_path, "ablation.sh", ABLATION=ablation, **env)
    stable, cooled = calls[:len(arms)], calls[len(arms):]
    assert sorted(option(c, "--arch") for c in stable) == sorted(arms) == sorted(option(c, "--arch") for c in cooled)
    for call in stable:
        assert option(call, "--tokens") == "251658240" and option(call, "--schedule") == "constant"
        assert option(call, "--stop-at") == "4096"
        assert " ".join(extra) in " ".join(call) and option(call, "--seed") == "0"
    for call in cooled:
        arch = option(call, "--arch")
        assert option(call, "--branch-from") == str(tmp_path / "run" / arch / "branches" / "step004096")
        assert int(option(call, "--tokens")) == 5120 * 16 * 512 and option(call, "--decay-start") == "4096"
        assert " ".join(extra) in " ".join(call)
    assert all((tmp_path / "run" / "cooldown" / f"{a}-step004096" / "final").is_dir() for a in arms)


def test_ablation_refuses_an_unknown_name(tmp_path):
    env = {**os.environ, "ABLATION": "lambda0.5", "RUN": str(tmp_path / "run")}
    done = subprocess.run(["bash", str(CAMPAIGN / "ablation.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "lambda0.8 or init-default" in done.stderr
    assert not (tmp_path / "run").exists()


def test_long_run_defaults_train_both_arms_to_the_full_budget(tmp_path):
    calls = run_script(tmp_path, "long.sh", SEED="3")
    assert sorted(option(c, "--arch") for c in calls) == ["diff", "transformer"]
    for call in calls:
        assert option(call, "--tokens") == "251658240" and option(call, "--seed") == "3"
        assert option(call, "--preset") == "xs" and "--lambda-init" not in call and "--init" not in call
        assert "--stop-at" not in call and option(call, "--lr") == "3e-3"
        assert option(call, "--threads") == "1"  # one core per arm: the two arms run side by side


def test_long_run_and_its_cooldowns_take_the_thread_count_asked(tmp_path):
    run_script(tmp_path, "long.sh", ARMS="diff", THREADS="2")  # one arm alone can have both cores
    calls = run_script(tmp_path, "cooldown.sh", ARMS="diff", THREADS="2")
    assert len(calls) == 2 and [option(c, "--threads") for c in calls] == ["2", "2"]


def test_long_run_and_its_cooldowns_take_the_learning_rate_asked(tmp_path):
    run_script(tmp_path, "long.sh", LR="1e-2")
    calls = run_script(tmp_path, "cooldown.sh", LR="1e-2")  # every call so far, the stable arms' first
    assert sum("--branch-from" in c for c in calls) == 2 and [option(c, "--lr") for c in calls] == ["1e-2"] * 4


def test_each_cooldown_keeps_its_stable_runs_options_but_the_schedule(tmp_path):
    """A cooldown continues the protocol of the run it branches from: every option of the stable arm's call comes
    back unchanged in its cooldown's, except the budget, the output and the schedule's own options."""
    calls = run_script(tmp_path, "ablation.sh", ABLATION="init-default", TEACHER="calib/models/stories260K.gguf")
    own = {"--tokens", "--out", "--schedule", "--branch-every", "--branch-from", "--decay-start", "--stop-at"}

    def options(call: list[str]) -> dict[str, str]:
        return {k: v for k, v in zip(call[1::2], call[2::2], strict=True) if k not in own}  # call[0]: "train"

    def by_arch(calls: list[list[str]]) -> list[dict[str, str]]:  # the arms run side by side, in either order
        return sorted((options(c) for c in calls), key=lambda o: o["--arch"])

    stable, cooled = calls[:2], calls[2:]
    assert len(cooled) == 2 and all(option(c, "--schedule") == "wsd" for c in cooled)
    assert by_arch(stable) == by_arch(cooled) and "--init" in options(stable[0])


def test_long_run_stops_both_arms_at_the_step_asked(tmp_path):
    calls = run_script(tmp_path, "long.sh", UNTIL="16384")
    assert len(calls) == 2 and all(option(c, "--stop-at") == "16384" for c in calls)
    assert all(option(c, "--tokens") == "251658240" for c in calls)  # the schedule stays the full run's


def test_a_final_whose_weights_are_parked_is_done_and_not_trained_again(tmp_path):
    """A parked final keeps config.json without model.safetensors (experiments/campaign/states.json): neither the
    stable run nor a cooldown of a restored branch trains it again."""
    assert len(run_script(tmp_path, "ablation.sh", ABLATION="lambda0.8")) == 2  # the stable run and its cooldown
    cooled = tmp_path / "run" / "cooldown" / "diff-step004096" / "final"
    for final in (tmp_path / "run" / "diff" / "final", cooled):
        (final / "model.safetensors").unlink()
    assert len(run_script(tmp_path, "ablation.sh", ABLATION="lambda0.8")) == 2  # no new call
    (cooled / "config.json").unlink()  # no final at all: the cooldown runs again
    assert [c[-2:] for c in run_script(tmp_path, "ablation.sh", ABLATION="lambda0.8")[2:]] == [
        ["--branch-from", str(tmp_path / "run" / "diff" / "branches" / "step004096")]]


def fake_arm(run: Path, arch: str, step: int, branches: dict[int, str]) -> None:
    """A stable arm at ``step`` with branches whose cooldowns are 'done', 'running' or ''."""
    state = run / arch / "state"
    state.mkdir(parents=True)
    config = {"tokens": 64 * 16 * 512, "batch_size": 16, "seq_len": 512}
    (state / "trainer.json").write_text(json.dumps({"step": step, "train_config": config, "history": {}}))
    for branch, cooldown in branches.items():
        (run / arch / "branches" / f"step{branch:06d}").mkdir(parents=True)
        out = run / "cooldown" / f"{arch}-step{branch:06d}"
        if cooldown:  # a cooldown's budget is its own: 5/4 of the branch step (cooldown.sh)
            steps = branch + branch // 4
            record = {"train_config": {"tokens": steps * 16 * 512}, "step": steps if cooldown == "done" else 37}
            part = out / ("train_log.json" if cooldown == "done" else "state/trainer.json")
            part.parent.mkdir(parents=True)
            part.write_text(json.dumps(record))
            if cooldown == "done":
                (out / "final").mkdir()
                (out / "final" / "config.json").write_text("{}")  # its weights may be parked: not looked at


def test_status_reports_steps_branches_and_cooldowns(tmp_path):
    from .helpers import load_script

    status = load_script(CAMPAIGN / "status.py")
    fake_arm(tmp_path / "long" / "xs-s0", "transformer", 40, {16: "done", 32: "running"})
    fake_arm(tmp_path / "long" / "xs-s0", "diff", 33, {16: "done", 32: ""})
    fake_arm(tmp_path / "ablation" / "xs-s0-lambda0.8", "diff", 16, {16: ""})
    fake_arm(tmp_path / "streamed" / "s-s0", "transformer", 8, {})
    rows = status.campaign_status(tmp_path)
    assert [(r["run"], r["arch"], r["step"], r["steps"]) for r in rows] == [
        ("xs-s0", "transformer", 40, 64), ("xs-s0", "diff", 33, 64), ("xs-s0-lambda0.8", "diff", 16, 64),
        ("s-s0", "transformer", 8, 64)]
    assert (rows[0]["cooled"], rows[0]["cooling"], rows[0]["uncooled"]) == ([20 * 8192], [(40 * 8192, 37)], [])
    assert (rows[1]["cooled"], rows[1]["cooling"], rows[1]["uncooled"]) == ([20 * 8192], [], [32])
    line = status.table(rows).splitlines()[2]  # 16 + 4 steps of 8,192 tokens = 0.16M; 40 steps = 0.33M
    assert line == "| xs-s0 | transformer | 40 (0.3M) | 64 | - / - | 0.2M | 0.3M (step 37 of 40) | - | 24 |"
    point = {"tokens": 40 * 8192, "layers": [{"attn_logits": {"top1": 61.25}, "hidden": {"top1": 7.0}},
                                             {"attn_logits": {"top1": 12.0}, "hidden": {"top1": 155.5}}]}
    log = {"history": {"outliers": [{"tokens": 0, "layers": []}, point]}}
    (tmp_path / "long" / "xs-s0" / "transformer" / "train_log.json").write_text(json.dumps(log))
    assert "| 64 | 61.2 / 155.5 |" in status.table(status.campaign_status(tmp_path)).splitlines()[2]


@pytest.mark.parametrize("branches, cooled",
                         [("", [4096, 8192, 24576]), ("24576", [24576]), ("8192 4096", [4096, 8192])])
def test_cooldown_cools_every_branch_or_those_asked(tmp_path, branches, cooled):
    for arch in ("transformer", "diff"):
        for step in (4096, 8192, 24576):
            (tmp_path / "run" / arch / "branches" / f"step{step:06d}").mkdir(parents=True)
    calls = run_script(tmp_path, "cooldown.sh", BRANCHES=branches)
    assert sorted({int(option(c, "--decay-start")) for c in calls}) == cooled and len(calls) == 2 * len(cooled)
    for call in calls:
        step = int(option(call, "--decay-start"))
        assert int(option(call, "--tokens")) == (step + step // 4) * 16 * 512


def test_budget_cools_each_arm_as_soon_as_it_reaches_the_step(tmp_path):
    slow_diff = FAKE_TRAIN.replace('echo "$*" >> "$CALLS"', 'echo "$*" >> "$CALLS"; args="$*"') + (
        '[[ -n "${branch:-}" || "$args" != *"--arch diff"* ]] || { sleep 2; echo "diff reached" >> "$CALLS"; }\n')
    calls = run_script(tmp_path, "budget.sh", fake_train=slow_diff, UNTIL="4096", PRESET="s")
    names = [("cool " if "--branch-from" in c else "") + option(c, "--arch") if "--arch" in c else " ".join(c)
             for c in calls]
    assert names.index("cool transformer") < names.index("diff reached") < names.index("cool diff")
    assert all(option(c, "--stop-at") == "4096" for c in calls if "--stop-at" in c) and len(calls) == 5
    assert all(option(c, "--preset") == "s" for c in calls if "--arch" in c)
    for arch in ("transformer", "diff"):
        assert (tmp_path / "run" / "cooldown" / f"{arch}-step004096" / "final").is_dir()


def test_budget_asks_for_its_step(tmp_path):
    env = {**os.environ, "RUN": str(tmp_path / "run")}
    env.pop("UNTIL", None)
    done = subprocess.run(["bash", str(CAMPAIGN / "budget.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "set UNTIL" in done.stderr and not (tmp_path / "run").exists()


def test_streamed_pair_trains_and_cools_on_fresh_teacher_stories_sharing_one_cache(tmp_path):
    calls = run_script(tmp_path, "streamed.sh", PRESET="s")
    assert sorted(option(c, "--arch") for c in calls) == ["diff", "diff", "transformer", "transformer"]
    for call in calls:
        assert "--data" not in call and option(call, "--teacher") == "calib/models/stories260K.gguf"
        assert option(call, "--stream-cache") == str(tmp_path / "run" / "stream-cache")
        assert option(call, "--preset") == "s" and option(call, "--lr") == "3e-3"
    stable = [c for c in calls if "--branch-from" not in c]
    assert len(stable) == 2 and all(option(c, "--stop-at") == "4096" for c in stable)


def test_corpus_runs_keep_the_cycled_corpus(tmp_path):
    calls = run_script(tmp_path, "ablation.sh", ABLATION="lambda0.8")
    assert all(option(c, "--data") == str(tmp_path / "corpus") and "--teacher" not in c for c in calls)
