"""Commands on our own compressed-tensors export where the compressed-tensors package is missing (issue 42),
table-driven: each runs in a child process that hides the package (``sys.modules[name] = None``: importing it
fails and ``importlib.util.find_spec`` answers None, as when it is not installed). Loading the folder through
transformers (``--device-map``) is refused with one line saying what to install, exit 2, inputs byte-identical;
diffquant's own reader needs no package, so the same commands without ``--device-map`` work.

``CASES`` maps an id to ``(argv, expected exit code, words)``; ``{ct}`` is the export, ``{text}`` a text file,
``{t}`` a scratch folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diffquant.cli import main

from .conftest import fingerprint

INSTALL = "pip install 'diffquant[export]'"
PROFILE = ["profile", "{ct}", "--data", "{text}", "--tokens", "64", "--seq-len", "32"]
SWEEP = ["sweep", "{ct}", "--target", "none", "--bits", "16", "--tasks", "{text}", "--limit", "2"]
CASES = {
    "profile/device-map": ([*PROFILE, "--device-map", "sequential", "--json", "{t}/p.json"], 2, INSTALL),
    "sweep/device-map": ([*SWEEP, "--device-map", "sequential", "--out", "{t}/s.jsonl"], 2, INSTALL),
    "profile/own-reader": ([*PROFILE, "--json", "{t}/own.json"], 0, "tokens profiled"),
    "sweep/own-reader": ([*SWEEP, "--out", "{t}/own.jsonl"], 0, "written"),
}
HIDDEN = textwrap.dedent("""
    import contextlib, io, json, sys
    sys.modules["compressed_tensors"] = None  # as if not installed
    from diffquant.cli import main
    results = {}
    for name, argv in json.loads(sys.argv[1]).items():
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
        results[name] = [code, err.getvalue(), out.getvalue()]
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def hidden(assets, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("missing")
    packed, export = root / "q", root / "ct"
    assert main(["quantize", str(assets["ckpt"]), "--weights", "rtn", "--bits", "4", "--out", str(packed)]) == 0
    assert main(["convert", str(packed), "--to", "hf", "--out", str(export)]) == 0
    names = {"ct": export, "text": assets["text"], "t": root / "scratch"}
    names["t"].mkdir()
    cases = {name: [a.format_map(names) for a in argv] for name, (argv, _, _) in CASES.items()}
    before = fingerprint(export, assets["text"])
    proc = subprocess.run([sys.executable, "-c", HIDDEN, json.dumps(cases)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"results": json.loads(proc.stdout.splitlines()[-1]),
            "unchanged": fingerprint(export, assets["text"]) == before}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_package_is_one_line_naming_what_to_install(case, hidden):
    code, err, out = hidden["results"][case]
    expected, words = CASES[case][1:]
    said = [line for line in err.splitlines() if line.startswith("diffquant")]  # (beside progress bars)
    assert code == expected, err
    if expected == 2:
        assert len(said) == 1 and said[0].startswith("diffquant: error:") and words in said[0], err
    else:
        assert not said and words in out, err
    assert "Traceback" not in err and hidden["unchanged"]
