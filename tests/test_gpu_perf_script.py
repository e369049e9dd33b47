"""The GPU performance script's CPU dry run: the same code path at toy sizes (the real run needs a GPU)."""

import json
import math
from pathlib import Path

import pytest
import torch

from .helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "gpu" / "perf_gpu.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT)


def finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_dry_run_writes_the_measurements(script, tmp_path):
    summary = script.main(["--dry-run", "--out", str(tmp_path), "--trace", str(tmp_path / "trace")])
    data = json.loads((tmp_path / "perf_gpu.json").read_text())
    assert data["device"] == "cpu" and data["dry_run"] and data["skipped_by_time_guard"] == []
    assert data["times_s"] == pytest.approx(summary["times_s"])

    assert [r["impl"] for r in data["throughput"]][:1] == ["sdpa"]
    for r in data["throughput"]:
        assert set(r["tokens_per_s"]) == {"transformer", "diff"}
        assert all(finite_positive(v) for v in r["tokens_per_s"].values())
        assert finite_positive(r["ratio_diff_over_transformer"])
    if not data["flash_attn"]["available"]:
        assert any(s["impl"] == "flash" for s in data["throughput_skipped"])
    assert data["diff_kernel"]["available"] is False  # the fused Diff kernel needs CUDA
    assert any(s["impl"] == "triton" and "needs CUDA" in s["reason"] for s in data["throughput_skipped"])

    (prof,) = data["profiling"]
    assert set(prof["ratio_to_eager"]) >= {"hidden", "hidden_logits"}
    assert all(finite_positive(v) for v in [*prof["ratio_to_eager"].values(), *prof["tokens_per_s"].values()])
    assert {"hidden_syncfree", "hidden_logits_syncfree"} <= set(prof["ratio_to_sdpa"])
    assert data["logits_kernel"]["available"] is False and "hidden_logits_kernel" not in prof["seconds"]

    (train,) = data["training"]
    assert train["preset"] == "tiny" and finite_positive(train["ratio_diff_over_transformer"])

    (attn,) = data["attention"]
    assert set(attn["time_over_transformer"]) == {"transformer_sdpa", "diff_sdpa"}  # no Triton run on the CPU
    assert all(finite_positive(v) for v in attn["seconds"].values()) and attn["failed"] == {}

    traces = data["traces"]
    assert {"forward_sdpa_diff", "forward_sdpa_transformer", "profile_hidden_logits_syncfree"} <= set(traces)
    for name, counts in traces.items():
        assert counts["events"] > 0 and counts["device_kernels"] == 0  # the CPU: no device kernels
        assert json.loads((tmp_path / "trace" / f"{name}.json").read_text())["traceEvents"]

    gptq = data["gptq"]
    assert finite_positive(gptq["fp32_ppl"]) and finite_positive(gptq["bf16_ppl"])
    assert {r["row"] for r in gptq["rows"]} == {"rtn", "gptq-full"}
    for r in gptq["rows"]:
        assert all(finite_positive(r[k]) for k in ("fp32_ppl", "bf16_ppl", "seconds"))

    md = (tmp_path / "perf_gpu.md").read_text()
    assert "Diff ÷ Transformer" in md and "hidden + logits" in md and "gptq-full" in md
    assert "Training-step throughput" in md and "hidden_logits_syncfree" in md


def test_triton_row_times_both_archs_and_says_whether_the_kernel_ran(script):
    """Where the kernel passes its self-check the row runs; here (the CPU, bf16) the model falls back to sdpa and
    the row says so."""
    plan = script.dataclasses.replace(script.DRY, impls=("triton",), repeats=1)
    rows, skipped = script.throughput(plan, torch.device("cpu"), script.Guard(60), {"available": False},
                                      {"available": True})
    (row,) = rows
    assert skipped == [] and row["impl"] == "triton" and row["diff_kernel_ran"] is False
    assert finite_positive(row["ratio_diff_over_transformer"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_without_cuda_and_without_dry_run_it_exits_with_one_line(script, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--out", str(tmp_path)])
    message = str(exit_info.value.code)
    assert "CUDA" in message and "--dry-run" in message and "\n" not in message
    assert not any(tmp_path.iterdir())
