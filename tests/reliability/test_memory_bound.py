"""Allocation cases under a hard memory limit: files that declare models of hundreds of gigabytes are refused
with one line (exit 2) before anything is allocated. Run in a child process with ``RLIMIT_AS`` = 2 GiB, where
building such a model, or reading such a tensor, would die of MemoryError instead."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from . import hostile as h
from .conftest import FIXTURES

LIMIT = 2 << 30
HUGE = {"vocab_size": 1 << 21, "d_model": 1 << 16}  # within the sanity limits: 137G parameters


def _cases(work: dict[str, Path], tmp: Path) -> dict[str, list[str]]:
    import shutil

    ours = shutil.copytree(work["ckpt"], tmp / "ours")
    h.edit_config(ours, **HUGE)
    bomb = shutil.copytree(work["ckpt"], tmp / "bomb")
    h.header_bomb(bomb / "model.safetensors")
    hf = h.hf_config_edit(h.hf_folder(work["ckpt"], tmp / "hf"), vocab_size=HUGE["vocab_size"],
                          hidden_size=HUGE["d_model"])
    from diffquant.cli import main

    assert main(["quantize", str(work["ckpt"]), "--weights", "rtn", "--bits", "4", "--out", str(tmp / "q")]) == 0
    h.edit_config(tmp / "q", **HUGE)
    return {"config": ["info", str(ours)], "header": ["info", str(bomb)], "hf": ["info", str(hf)],
            "hf-native": ["profile", str(hf)], "packed": ["info", str(tmp / "q")]}


@pytest.mark.slow  # ≥ 9 s (pytest --durations)
def test_huge_declared_models_are_refused_within_2_gib(work, tmp_path):
    cases = _cases(work, tmp_path)
    script = textwrap.dedent(f"""
        import contextlib, io, json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT}))
        from diffquant.cli import main
        results = {{}}
        for name, argv in json.loads(sys.argv[1]).items():
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
            results[name] = [code, err.getvalue()]
        results["peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(results))
    """)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert results.pop("peak_kib") * 1024 < LIMIT
    for name, (code, err) in results.items():
        assert code == 2 and err.startswith("diffquant: error:") and err.count("\n") == 1, (name, err)


def _large_records(path: Path, items: int = 3000, cells: int = 16) -> Path:
    """``cells`` multiple-choice records (distinct bit widths) of ``items`` random items each, one per line."""
    import numpy as np

    lines = (FIXTURES / "records.jsonl").read_text().splitlines()
    template = next(r for r in map(json.loads, lines) if r["kind"] == "multiple_choice")
    rng = np.random.default_rng(0)
    with path.open("w") as fh:
        for bits in range(1, cells + 1):
            ll = rng.normal(-50, 10, (items, 4))
            rows = [{"id": i, "gold": 0, "predicted": int(ll[i].argmax()), "predicted_norm": int(ll[i].argmax()),
                     "correct": bool(ll[i].argmax() == 0), "correct_norm": bool(ll[i].argmax() == 0),
                     "ll": ll[i].tolist()} for i in range(items)]
            rec = {**template, "bits": bits, "target": "attn_logits", "metrics": {**template["metrics"],
                                                                                 "n": items, "items": rows}}
            fh.write(json.dumps(rec) + "\n")
    return path


def _traced_peak(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_report_holds_less_than_its_records_file(tmp_path):
    """`report` reads records line by line into arrays: its peak stays below the file's size (read whole, as
    parsed JSON, it is ~2.7x the file)."""
    from diffquant.records import load_records

    file = _large_records(tmp_path / "large.jsonl")
    size = file.stat().st_size
    compact = _traced_peak(lambda: load_records([file], compact=True))
    parsed = _traced_peak(lambda: load_records([file]))
    assert compact < 0.8 * size < 2 * size < parsed, (compact, size, parsed)
