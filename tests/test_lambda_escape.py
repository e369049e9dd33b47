"""experiments/lambda_escape.py: λ's first step outside [0, 1] per layer and the warm-up spike, from a train log."""

import json
import random

import pytest

from .helpers import load_script
from .test_experiments_index import EXPERIMENTS

escape = load_script(EXPERIMENTS / "lambda_escape.py")


def diff_log(curves: list[list[float]], losses: list[float], warmup: int = 5) -> dict:
    """A Diff train log whose tracked λ (every 128 steps) follow ``curves`` (one list per layer)."""
    points = [{"step": 128 * k, "layers": [{"layer": i, "lambda": c[k], "lambda_init": c[0]}
                                           for i, c in enumerate(curves)]} for k in range(len(curves[0]))]
    return {"train_config": {"lr": 3e-3, "warmup_steps": warmup},
            "history": {"train_loss": losses, "outliers": points}}


def test_each_layers_first_step_outside_the_range_and_the_spike_are_found():
    rng = random.Random(7)
    inside = [rng.uniform(0.05, 0.95) for _ in range(6)]
    above = [0.3, 0.8, 1.0, 1.7, 0.9, 4.2]  # 1.0 is inside; it leaves at the 4th point (step 384) and comes back
    below = [0.2, -0.01, -0.4, -0.3, -0.2, -0.1]
    losses = [6.2] + [rng.uniform(4.0, 6.0) for _ in range(20)]
    losses[7] = 11.5  # the spike, inside the first two warm-ups (10 steps)
    losses[15] = 30.0  # after them: not the warm-up's
    record = escape.run_record(diff_log([inside, above, below], losses))
    assert [x["left_at_step"] for x in record["layers"]] == [None, 384, 128]
    assert record["layers"][1]["lambda_then"] == 1.7 and record["layers"][1]["lambda_last"] == 4.2
    assert record["layers"][2]["lambda_then"] == -0.01 and record["layers"][0]["lambda_then"] is None
    assert record["warmup"] == {"first_loss": 6.2, "max_loss": 11.5, "max_step": 7, "spike": True}
    assert record["last_step"] == 640
    table = escape.escape_table({"run": record})
    assert "L1 at 384: 1.70 → 4.20; L2 at 128: -0.01 → -0.10" in table and "11.50 at 7 (spike)" in table


def test_a_warmup_without_a_spike_and_a_log_without_lambda(tmp_path):
    losses = [6.2 - 0.1 * i for i in range(12)]
    assert escape.run_record(diff_log([[0.2, 0.5]], losses))["warmup"]["spike"] is False
    run = tmp_path / "transformer"
    run.mkdir()
    log = diff_log([[0.2, 0.5]], losses)
    for point in log["history"]["outliers"]:
        point["layers"] = [{"layer": 0}]  # a Transformer tracks no λ
    (run / "train_log.json").write_text(json.dumps(log))
    with pytest.raises(SystemExit, match=r"lambda_escape.py: .*transformer: no tracked λ"):
        escape.main([str(run)])
    (run / "train_log.json").write_text(json.dumps({"history": {}}))
    with pytest.raises(SystemExit, match=r"lambda_escape.py: .*transformer: not a train log \(no 'outliers'\)"):
        escape.main([str(run)])


@pytest.mark.parametrize("diff, transformer", [("diff", "transformer"), ("diff-lr1e-2-s3", "transformer-lr1e-2-s3")])
def test_the_transformer_beside_it_and_the_json_records(tmp_path, capsys, diff, transformer):
    for arm, losses in ((diff, [6.0, 9.5, 5.0, 4.0]), (transformer, [6.0, 7.0, 5.0, 4.0])):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "train_log.json").write_text(json.dumps(diff_log([[0.2, 1.5]], losses)))
    assert escape.main([str(tmp_path / diff), "--out", str(tmp_path / "r.json")]) == 0
    record = json.loads((tmp_path / "r.json").read_text())[str(tmp_path / diff)]
    assert record["layers"][0]["left_at_step"] == 128 and record["warmup"]["spike"] is True
    assert record["transformer_warmup"] == {"first_loss": 6.0, "max_loss": 7.0, "max_step": 1, "spike": False}
    row = [cell.strip() for cell in capsys.readouterr().out.splitlines()[2].split("|")]
    assert row[5:8] == ["9.50 at 1 (spike)", "7.00 at 1", "L0 at 128: 1.50 → 1.50"]


def test_campaign_runs_are_named_from_the_campaign_folder_however_given(monkeypatch):
    monkeypatch.chdir(EXPERIMENTS.parent)
    for given in ("experiments/campaign/streamed/s-lr3e-3-s1/diff", escape.CAMPAIGN / "streamed/s-lr3e-3-s1/diff"):
        assert escape.run_name(escape.Path(given)) == "streamed/s-lr3e-3-s1/diff"
    assert escape.run_name(escape.Path("/tmp/elsewhere/diff")) == "/tmp/elsewhere/diff"
