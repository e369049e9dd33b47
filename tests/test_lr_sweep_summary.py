"""experiments/lr_sweep/summarize.py with a run whose final weights are parked in history."""

import json
from pathlib import Path

import pytest

from .helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "lr_sweep" / "summarize.py"


def test_a_parked_run_keeps_its_earlier_record_and_without_one_names_the_restore(tmp_path):
    summarize = load_script(SCRIPT)
    run = tmp_path / "diff-lr1e-2-s0"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")  # the weights are parked: only the config stays
    (run / "train_log.json").write_text(json.dumps({"tokens_seen": 1, "history": {}}))
    earlier = {"run": run.name, "arch": "diff", "lr": 0.01, "seed": 0, "val_loss": 2.5}
    assert summarize.run_record(run, None, {run.name: earlier}) is earlier
    with pytest.raises(SystemExit, match=f"restore_states.sh {run}/final$"):
        summarize.run_record(run, None, {})
    assert summarize.run_record(tmp_path / "notes", None, {}) is None  # not a run
