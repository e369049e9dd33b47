"""torchrun launches whose ranks were given different arguments (issue 42), table-driven: two gloo ranks spawned
here run the CLI in-process, one process group per case; every case ends with exit 2 on both ranks, one line
from rank 0 naming the argument and who holds what (rank 1 stays silent: its line would be the same), nothing
written and every input byte-identical. Then a rank that fails on its own: its own line is printed, prefixed
with its rank, and rank 0 says that a rank left.

``CASES`` maps an id to ``(rank 0's argv, rank 1's argv, words)``; ``{ckpt}``, ``{text}`` and ``{out}`` are a
checkpoint, a text file and an output path.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from .conftest import fingerprint

PROFILE = ["profile", "{ckpt}", "--data", "{text}", "--seq-len", "32", "--batch-size", "2", "--tokens", "320",
           "--json", "{out}"]
SWEEP = ["sweep", "{ckpt}", "--target", "weights-rtn", "--bits", "16", "--tasks", "{text}", "--limit", "2",
         "--out", "{out}"]


def given(argv: list[str], flag: str, value: str | None) -> list[str]:
    """``argv`` with ``flag``'s value replaced (None: the flag left out)."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:] if value is None else [*argv[:i + 1], value, *argv[i + 2:]]


CASES = {
    "profile/tokens": (PROFILE, given(PROFILE, "--tokens", "640"), "different --tokens (rank 0: 320; rank 1: 640)"),
    "profile/seq-len": (PROFILE, given(PROFILE, "--seq-len", "16"), "different --seq-len (rank 0: 32; rank 1: 16)"),
    "profile/batch-size-default": (given(PROFILE, "--batch-size", None), PROFILE,
                                   "different --batch-size (rank 0: 8; rank 1: 2)"),
    "profile/checkpoints": (PROFILE, ["profile", "{text}", *PROFILE[2:]], "different checkpoints (rank 0: ['"),
    "sweep/limit": (SWEEP, given(SWEEP, "--limit", "3"), "different --limit (rank 0: 2; rank 1: 3)"),
    "the-command": (PROFILE, SWEEP, "different the command (rank 0: profile; rank 1: sweep)"),
}


def _ports(n: int) -> list[int]:
    """``n`` distinct free ports (each held until all are chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _run(argv: list[str], port: int) -> list:
    from diffquant.cli import main

    os.environ["MASTER_PORT"] = str(port)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return [code, err.getvalue()]


def _worker(rank: int, ports: list[int], names: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      DIFFQUANT_DIST_BACKEND="gloo")
    import torch

    torch.set_num_threads(1)
    results = {}
    for (case, argvs), port in zip(CASES.items(), ports, strict=False):
        where = {**names, "out": f"{names['out']}/{case.replace('/', '-')}"}
        results[case] = _run([a.format_map(where) for a in argvs[rank]], port)
    if rank == 1:  # a failure of this rank alone, outside any collective
        import diffquant.profile_checkpoint as library
        from diffquant.errors import UserError

        library.documents = lambda *_: (_ for _ in ()).throw(UserError("text.txt: unreadable on this rank"))
    results["alone"] = _run([a.format_map({**names, "out": f"{names['out']}/alone"}) for a in PROFILE], ports[-1])
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def launched(assets, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("launch")
    names = {"ckpt": str(shutil.copytree(assets["ckpt"], root / "ckpt")),
             "text": str(shutil.copyfile(assets["text"], root / "text.txt")), "out": str(root / "out")}
    Path(names["out"]).mkdir()
    before = fingerprint(root)
    mp.spawn(_worker, args=(_ports(len(CASES) + 1), names, str(root)), nprocs=2, join=True)
    results = [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        (root / f"rank{r}.json").unlink()
    return {"results": results, "unchanged": fingerprint(root) == before, "written": os.listdir(names["out"])}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_given_different_arguments_refuse_in_one_line(case, launched):
    (code0, err0), (code1, err1) = (launched["results"][r][case] for r in range(2))
    assert code0 == code1 == 2, (err0, err1)
    assert err0.startswith("diffquant: error: the ranks of this launch were given ") and err0.count("\n") == 1, err0
    assert CASES[case][2] in err0 and "every rank must run the same command" in err0, err0
    assert err1 == "" and "Traceback" not in err0


def test_nothing_is_written_and_the_inputs_are_unchanged(launched):
    assert launched["unchanged"] and launched["written"] == []


def test_a_rank_failing_alone_says_why_with_its_rank(launched):
    (code0, err0), (code1, err1) = (launched["results"][r]["alone"] for r in range(2))
    assert code1 == 2 and err1 == "diffquant: rank 1: error: text.txt: unreadable on this rank\n", err1
    said = [line for line in err0.splitlines() if line.startswith("diffquant")]  # (beside the progress bar)
    assert code0 == 1 and len(said) == 1 and "another rank left the launch" in said[0], err0
