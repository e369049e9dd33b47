"""The GPU script's CPU dry run: the same code path at toy sizes (the real run needs an H200)."""

import json
from pathlib import Path

import pytest

from diffquant.io import read_json_file
from diffquant.records import read_records
from diffquant.study.figure8 import GRANULARITIES
from diffquant.study.table5 import profile_path

from .helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "gpu" / "run_gpu.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def dry_run(script, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-dry")
    return out, script.main(["--dry-run", "--out", str(out)])


def expected_pairs(script) -> set[str]:
    plan = script.DRY
    return {f"{g.label}-s{g.seed}-{script.tokens_label(b)}" for g in plan.groups for b in g.budgets}


@pytest.mark.slow
def test_dry_run_samples_trains_and_evaluates_every_pair(script, dry_run):
    out, summary = dry_run
    assert summary["device"] == "cpu" and summary["times_s"]["total"] > 0
    assert summary["skipped_by_time_guard"] == [] and summary["diverged"] == []
    assert summary["sampling"]["tokens_drawn"] > 0 and summary["sampling"]["blocks_cached"] >= 1
    assert not (out / "corpus").exists()  # streamed: no corpus phase
    pairs = json.loads((out / "pairs.json").read_text())
    assert {p["pair"] for p in pairs} == set(summary["gate"]) == expected_pairs(script)
    for pair in pairs:
        assert set(pair["logit_top1"]) == {"transformer", "diff"} and isinstance(pair["gate"], bool)
        table5 = read_json_file(profile_path(out, pair["pair"]))
        assert table5["diff"]["sites"]["attn_logits"]["count"] > 0
        records = read_records(out / "figure8" / f"{pair['pair']}.jsonl.gz")  # written compressed
        tasks = len(script.DRY.sweep_limits)
        assert len(records) == 2 * tasks * (1 + 3 * len(GRANULARITIES))  # models x tasks x (16 + bits x gran.)
    for name in ("gate.md", "seeds.md", "table5.md", "figure8.md", "trend.md", "trend.png", "zeroshot.md",
                 "summary.json", "emergence.md"):
        assert (out / name).stat().st_size > 0
    blocks = json.loads((out / "emergence.json").read_text())
    assert set(blocks) == {"xs-s0", "xs-l0.8-s0", "xs-b4-s0", "xs-s1", "s-s0", "m-s0"}  # xs-s0: two groups, one run
    assert len(blocks["xs-s0"]) > 1 and blocks["xs-s0"][0]["points"] >= script.DRY.block_points
    best = {"xs-s0-8.19K", "xs-l0.8-s0-2.05K", "xs-b4-s0-1.02K", "s-s0-2.05K", "m-s0-1.02K"}
    assert set(summary["zeroshot_above_chance"]) == best  # each label's best-trained
    tests = json.loads((out / "zeroshot.json").read_text())[0]["tests"]
    assert {(t["task"], t["n"]) for t in tests} == {("copa", 8)} and len(tests) == 4


@pytest.mark.slow
def test_cooldowns_branch_from_the_stable_runs_and_track_outliers(script, dry_run):
    out, _ = dry_run
    plan = script.DRY
    step = script.branch_step(4096, plan)
    log = json.loads((out / "cooled" / "xs-s0-diff-4.1K" / "train_log.json").read_text())
    assert log["branch_from"].endswith(f"stable/xs-s0-diff/branches/step{step:06d}")
    assert log["train_config"]["decay_start"] == step and log["train_config"]["schedule"] == "wsd"
    assert log["step"] * plan.tokens_per_step == 4096  # stable + 20 % cooldown = the budget
    assert log["history"]["outliers"] and log["history"]["outliers"][-1]["step"] == log["step"]
    stable = json.loads((out / "stable" / "xs-s0-transformer" / "train_log.json").read_text())
    assert stable["step"] == script.branch_step(8192, plan)  # the seed-0 run went on for the 8K budget
    assert not (out / "cooled" / "xs-s0-diff-4.1K" / "state").exists()


def test_time_guard_stops_gracefully_and_still_writes_outputs(script, tmp_path):
    summary = script.main(["--dry-run", "--time-limit", "0.5", "--out", str(tmp_path)])
    assert summary["pairs_trained"] == [] and summary["pairs_evaluated"] == []
    assert any("stable steps" in s["what"] for s in summary["skipped_by_time_guard"])
    assert "No pair was evaluated" in (tmp_path / "gate.md").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["times_s"]["total"] > 0


def test_evaluation_order_puts_the_budget_every_seed_reached_first(script):
    def pair(preset, seed, budget, tokens):
        return {"preset": preset, "seed": seed, "budget": budget, "tokens": tokens}

    pairs = [pair("xs", 0, "30M", 30), pair("xs", 0, "100M", 100), pair("xs", 1, "30M", 30),
             pair("xs", 1, "100M", 100), pair("s", 0, "30M", 30), pair("xs", 0, "250M", 250)]
    order = [(p["preset"], p["seed"], p["budget"]) for p in script.evaluation_order(pairs)]
    assert order[:3] == [("xs", 0, "100M"), ("xs", 1, "100M"), ("s", 0, "30M")]
    assert order[3] == ("xs", 0, "250M")


def test_stable_chunks_end_at_every_branch_point(script):
    plan = script.FULL
    group = script.Group("xs", 0, (30_000_000, 100_000_000))
    targets = script.stable_targets(group, plan, 0)
    points = [script.branch_step(b, plan) for b in group.budgets]
    assert set(points) <= set(targets) and targets == sorted(targets)
    assert max(b - a for a, b in zip([0, *targets[:-1]], targets, strict=True)) <= plan.chunk_steps
    cooled = [(p + script.cooldown_steps(p, plan)) * plan.tokens_per_step for p in points]
    assert [round(t / 1e6) for t in cooled] == [30, 100]
    assert script.stable_targets(script.Group("xs", 0, (250_000_000,)), plan, points[-1])[0] > points[-1]


@pytest.mark.slow
def test_a_rerun_reuses_the_corpus_the_runs_and_the_records(script, dry_run):
    out, first = dry_run
    again = script.main(["--dry-run", "--out", str(out)])
    assert again["train_tokens_per_s_last_stretch"] == {}  # nothing was left to train
    assert again["pairs_evaluated"] == first["pairs_evaluated"] and again["gate"] == first["gate"]
    assert again["sampling"]["tokens_drawn"] == 0  # nothing trained, nothing drawn
    assert again["sampling"]["blocks_cached"] == first["sampling"]["blocks_cached"]


@pytest.mark.slow
def test_every_run_is_streamed_and_the_controls_share_what_they_should(script, dry_run):
    out, _ = dry_run
    pairs = {p["pair"]: p for p in json.loads((out / "pairs.json").read_text())}
    for pair in pairs.values():
        for memo in pair["memorisation"].values():
            assert memo["streamed"] and memo["note"] == "streamed: none by construction" and memo["se"] > 0
    # the λ_init-0.8 arm is set against the scheduled group's own Transformer
    lam, plain = pairs["xs-l0.8-s0-2.05K"], pairs["xs-s0-2.05K"]
    assert lam["checkpoints"]["transformer"] == plain["checkpoints"]["transformer"]
    config = json.loads((Path(lam["checkpoints"]["diff"]) / "config.json").read_text())
    assert config["lambda_init"] == 0.8
    # steps-vs-tokens: batch 4 to the same optimizer steps as the batch-8 pair, half the tokens, same stream
    control = pairs["xs-b4-s0-1.02K"]
    logs = {name: json.loads(Path(p["train_logs"]["transformer"]).read_text()) for name, p in
            (("control", control), ("plain", plain))}
    assert logs["control"]["step"] == logs["plain"]["step"] and control["tokens"] * 2 == plain["tokens"]
    streams = {name: log["data"]["stream"] for name, log in logs.items()}
    assert streams["control"]["batch_size"] == 4 and streams["plain"]["batch_size"] == 8
    assert logs["control"]["data"]["train_tokens_sha256"] == logs["plain"]["data"]["train_tokens_sha256"]


def test_the_full_plan_fits_a_window_and_names_every_rate(script):
    plan = script.FULL
    assert plan.time_limit_s <= 570 and plan.device == "cuda" and plan.bf16
    assert [g.label for g in plan.groups[:5]] == ["m", "s", "xs", "xs-l0.8", "xs-b16"]
    assert {g.seed for g in plan.groups} == {0, 1, 2} and plan.groups[-1].preset == "l"
    for group in plan.groups:
        for arch in script.ARCHS:
            assert f"{group.preset}/{arch}" in plan.guess_tokens_per_s
    control, plain = plan.groups[4], plan.groups[2]
    assert [script.branch_step(b, plan, control) for b in control.budgets] == \
        [script.branch_step(b, plan, plain) for b in plain.budgets]  # the same optimizer steps
