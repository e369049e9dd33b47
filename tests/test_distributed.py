"""Data parallelism (gloo, 2 processes spawned here): merged results equal a single process, bit for bit."""

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import diffquant as dq
from diffquant import distributed
from diffquant.cli import main
from diffquant.data import documents
from diffquant.records import read_records
from diffquant.sweep import run_sweep

from .conftest import tiny_config
from .helpers import randomize_

REPO = Path(__file__).resolve().parents[1]
TIMING = ("wall_time_s", "quantize_s", "created")
PROFILES = {"global": dict(), "exact": dict(exact_median=True), "per_sequence": dict(protocol="per_sequence")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _profile_model(arch: str):
    torch.manual_seed(0)  # randomize_ draws from the global generator
    return randomize_(dq.build_model(tiny_config(arch, max_seq_len=16), seed=0)).eval()


def _batches() -> list[torch.Tensor]:
    """5 batches (3 on one rank, 2 on the other) of repeated windows: equal values tie across windows and ranks."""
    base = torch.randint(0, 101, (3, 16), generator=torch.Generator().manual_seed(7))
    order = [0, 1, 0, 2, 1, 0, 2, 2, 1, 0]
    return list(base[order].split(2))


def _profiles() -> dict[str, str]:
    out = {}
    for arch in ("transformer", "diff"):
        for name, kw in PROFILES.items():
            report = dq.profile(_profile_model(arch), _batches(), topk=7, progress=False, **kw)
            out[f"{arch}-{name}"] = report.to_json()
    return out


def _sweep(ckpts: list[str], text: str, out: Path) -> None:
    run_sweep(ckpts, out, target="attn_logits", bits=[16, 4], tasks=[text, "copa"], limit=5, batch_size=2,
              progress=False)


def _failures(tmp: Path) -> dict[str, str]:
    """Rank 1 fails inside the collective work; every rank must raise the same one line, nothing is written."""
    out = {}
    model = _profile_model("transformer")
    if distributed.rank() == 1:
        model.register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(ValueError("boom")))
    try:
        dq.profile(model, _batches(), progress=False)
    except distributed.RankInputError as exc:
        out["profile"] = str(exc)
    return out


def _worker(rank: int, world: int, port: int, tmp: str, ckpts: list[str], text: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), DIFFQUANT_DIST_BACKEND="gloo")
    torch.set_num_threads(1)
    tmp = Path(tmp)
    with distributed.session():
        assert distributed.world_size() == world
        result = {"profiles": _profiles(), "failures": _failures(tmp)}
        _sweep(ckpts, text, tmp / "dist.jsonl")
        if distributed.rank() == 1:  # a scoring failure on rank 1 leaves no record behind
            import diffquant.evaluate as ev

            ev._logits = lambda *a: (_ for _ in ()).throw(RuntimeError("scoring died"))
        try:
            _sweep(ckpts, text, tmp / "failed.jsonl")
        except distributed.RankFailed as exc:
            result["failures"]["sweep"] = str(exc)
        (tmp / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    torch.manual_seed(0)
    ckpts = [str(dq.save_checkpoint(randomize_(dq.build_model(tiny_config(arch, vocab_size=8192, max_seq_len=32))),
                                    tmp / f"tiny-{arch}")) for arch in ("transformer", "diff")]
    text = tmp / "text.txt"
    text.write_text(documents("tinyshakespeare")[0].text[:1500])
    return tmp, ckpts, str(text)


@pytest.fixture(scope="module")
def spawned(setup):
    tmp, ckpts, text = setup
    try:
        mp.spawn(_worker, args=(2, _free_port(), str(tmp), ckpts, text), nprocs=2, join=True)
    except mp.ProcessExitedException as exc:  # killed by a signal: gloo's C++ teardown aborts once in a long while
        if exc.signal_name is None:
            raise
        warnings.warn(f"spawned ranks died ({exc}); retrying once", stacklevel=1)
        for name in ("dist.jsonl", "failed.jsonl", "rank0.json", "rank1.json"):
            (tmp / name).unlink(missing_ok=True)
        mp.spawn(_worker, args=(2, _free_port(), str(tmp), ckpts, text), nprocs=2, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def test_distributed_profile_json_equals_single_process(spawned):
    single = _profiles()
    for rank_result in spawned:  # every rank returns the merged report
        assert rank_result["profiles"].keys() == single.keys()
        for key, text in single.items():
            assert rank_result["profiles"][key] == text, key  # values, coordinates, medians, counts, tie order
    exact = json.loads(single["diff-exact"])
    assert exact["sites"]["attn_logits"]["quantiles_exact"] and exact["sequences"] == 10


def test_distributed_sweep_records_equal_single_process(setup, spawned):
    tmp, ckpts, text = setup
    _sweep(ckpts, text, tmp / "single.jsonl")
    single, dist = read_records(tmp / "single.jsonl"), read_records(tmp / "dist.jsonl")
    assert len(single) == 8
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING} for r in rs]
    assert strip(dist) == strip(single)


def test_a_failing_rank_fails_every_rank_with_one_line_and_writes_nothing(setup, spawned):
    tmp = setup[0]
    for rank_result in spawned:
        assert rank_result["failures"] == {"profile": "rank 1: ValueError: boom",
                                           "sweep": "rank 1: RuntimeError: scoring died"}
    assert not read_records(tmp / "failed.jsonl", missing_ok=True)


def test_single_process_helpers_are_the_identity():
    assert not distributed.is_distributed() and distributed.is_main() and distributed.world_size() == 1
    assert distributed.block([1, 2, 3]) == (0, [1, 2, 3]) and list(distributed.strided(3)) == [0, 1, 2]
    assert distributed.reduce_on_main(lambda: 2, lambda parts: parts) == [2]
    with pytest.raises(KeyError):  # single process: errors pass through unchanged
        distributed.on_main(lambda: {}["x"])


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DIFFQUANT_DIST_BACKEND": "gloo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "-m", "diffquant", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.mark.slow
def test_torchrun_cli_profile_equals_single_process(setup):
    tmp, ckpts, text = setup
    common = ["profile", ckpts[1], "--data", text, "--tokens", "320", "--seq-len", "32", "--batch-size", "2",
              "--topk", "10"]
    assert main([*common, "--json", str(tmp / "cli-single.json")]) == 0
    run = _torchrun([*common, "--json", str(tmp / "cli-dist.json")], tmp)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp / "cli-dist.json").read_text() == (tmp / "cli-single.json").read_text()
    assert run.stdout.count("tokens profiled") == 1  # rank 0 prints, the other rank is silent

    bad = _torchrun(["profile", ckpts[1], "--data", str(tmp / "missing.txt"), "--json", str(tmp / "x.json")], tmp)
    assert bad.returncode != 0 and not (tmp / "x.json").exists()
    assert bad.stderr.count("diffquant: error:") == 1
