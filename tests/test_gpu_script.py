"""The GPU-scale script's CPU dry run: the same code path at tiny sizes (the real run needs an H200)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "gpu" / "run_gpu.py"


@pytest.mark.slow
def test_dry_run_trains_profiles_and_sweeps(tmp_path):
    spec = importlib.util.spec_from_file_location("run_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(["--dry-run", "--out", str(tmp_path)])
    assert summary["device"] == "cpu" and summary["times"]["total_s"] > 0
    table5 = json.loads((tmp_path / "table5.json").read_text())
    assert set(table5) == {"transformer", "diff"}
    assert table5["diff"]["sites"]["attn_logits"]["count"] > 0
    records = [json.loads(line) for line in (tmp_path / "figure8.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 4 * 2  # models x bits x tasks
    for name in ("table5.md", "table5.png", "figure8.md", "figure8.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
