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
