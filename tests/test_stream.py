"""Streamed teacher data: windows a function of (seed, step), byte-identical runs and resumes, the memorisation
check against a float64 reference."""

import math
import os
import socket
import subprocess

import numpy as np
import pytest
import torch

from diffquant.checkpoint.gguf import stories260k_path
from diffquant.cli import main
from diffquant.config import ModelConfig
from diffquant.model import build_model
from diffquant.sample import sample_corpus, sample_stories
from diffquant.stream import TokenStream, check_steps, memorisation_check, stream_seed
from diffquant.train import TrainConfig, train

SEQ, BATCH, MAX_LEN = 32, 4, 48


def make_stream(seed=0, batch_size=BATCH, **kw) -> TokenStream:
    kw = {"max_len": MAX_LEN, "draw_batch": 8, "block_tokens": 2 * BATCH * SEQ, **kw}
    return TokenStream(stories260k_path(), seed, batch_size, SEQ, **kw)


@pytest.fixture(scope="module")
def stream():
    return make_stream()


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """A teacher corpus of its own, so that no test depends on the campaign's parked one being restored."""
    out = tmp_path_factory.mktemp("corpus")
    sample_corpus(stories260k_path(), out, tokens=4096, batch_size=32, max_len=64, shard_tokens=4096, progress=False)
    return out


def test_windows_are_the_exact_samplers_stories_cut_in_order(stream):
    gen = torch.Generator().manual_seed(stream_seed("train", 0, 1))
    ids = []
    while sum(map(len, ids)) < stream.windows_per_block * SEQ + 1:
        ids += sample_stories(stream.model, 8, gen, stream.bos_id, stream.stop_ids, MAX_LEN)
    ids = np.concatenate(ids)
    block = stream.block(1)
    assert stream.windows_per_block == 2 * BATCH and block.shape == (2 * BATCH, SEQ + 1)
    for i, row in enumerate(block):  # consecutive windows share their boundary token
        np.testing.assert_array_equal(row, ids[i * SEQ:i * SEQ + SEQ + 1])
    x, y = stream.batch(3)  # step 3 is block 1's second step
    np.testing.assert_array_equal(x.numpy(), block[BATCH:, :-1])
    np.testing.assert_array_equal(y.numpy(), block[BATCH:, 1:])


def test_a_step_straddling_two_blocks_and_other_batch_sizes_read_the_same_windows(stream):
    odd = make_stream(batch_size=3)  # windows 3..5 of step 1: block 0's last two, block 1's first
    both = np.concatenate([stream.block(0), stream.block(1)])
    np.testing.assert_array_equal(odd.windows_at(1), both[3:6])
    np.testing.assert_array_equal(odd.windows_at(2), both[6:9])
    assert odd.identity == stream.identity


def test_steps_purposes_and_seeds_draw_different_stories(stream):
    assert len({stream_seed(p, s, i) for p in ("train", "fresh") for s in (0, 1) for i in (0, 1)}) == 8
    a, b = stream.windows_at(0), stream.windows_at(2)
    assert not np.array_equal(a, b)
    assert not np.array_equal(stream.fresh_windows(BATCH), a)
    assert not np.array_equal(make_stream(seed=1).windows_at(0), a)
    np.testing.assert_array_equal(make_stream().windows_at(2), b)  # a new stream, the same step: the same tokens


def test_a_stream_cache_serves_the_drawn_block(tmp_path):
    tmp_path = tmp_path / "made on first use"
    first = make_stream(cache_dir=tmp_path)
    drawn = first.windows_at(1)
    files = list(tmp_path.glob("stream-*.npy"))
    assert len(files) == 1 and first.tokens_drawn > 0
    second = make_stream(cache_dir=tmp_path)
    np.testing.assert_array_equal(second.windows_at(1), drawn)
    assert second.tokens_drawn == 0
    assert not list(tmp_path.glob("*.lock"))


def lock_of(stream, index):
    return stream._cache_path(index), stream._lock_path(index)


def test_a_block_another_arm_is_drawing_is_read_and_the_next_one_drawn_meanwhile(tmp_path, monkeypatch):
    reference = make_stream()
    arm = make_stream(cache_dir=tmp_path)
    path, lock = lock_of(arm, 1)
    holder = subprocess.Popen(["sleep", "60"])  # the other arm, alive, drawing block 1
    lock.write_text(f"{socket.gethostname()} {holder.pid}\n")
    waits = []

    def other_arm_finishes():
        waits.append(len(waits))
        np.save(path, reference.block(1).astype(np.uint16))
        lock.unlink()

    monkeypatch.setattr(arm, "_wait_for_other", other_arm_finishes)
    try:
        np.testing.assert_array_equal(arm.block(1), reference.block(1))
    finally:
        holder.kill()
        holder.wait()
    assert waits == [0]
    np.testing.assert_array_equal(np.load(arm._cache_path(2)), reference.block(2))
    only_block_2 = make_stream()
    only_block_2.block(2)
    assert arm.tokens_drawn == only_block_2.tokens_drawn  # block 1 was not drawn twice
    assert not list(tmp_path.glob("*.lock"))


@pytest.mark.parametrize("left_by", ["a process that died", "another host, hours ago"])
def test_a_lock_left_behind_is_taken_over(tmp_path, left_by, monkeypatch):
    arm = make_stream(cache_dir=tmp_path)
    monkeypatch.setattr(arm, "_wait_for_other", lambda: pytest.fail("waited for a lock nobody holds"))
    path, lock = lock_of(arm, 0)
    if left_by == "a process that died":
        gone = subprocess.Popen(["true"])
        gone.wait()
        lock.write_text(f"{socket.gethostname()} {gone.pid}\n")
    else:
        lock.write_text(f"elsewhere-{socket.gethostname()} 1\n")
        os.utime(lock, (0, 0))
    np.testing.assert_array_equal(arm.block(0), make_stream().block(0))
    assert path.is_file() and not lock.exists()


@pytest.mark.parametrize("spoil", ["truncate", "reshape", "out_of_vocab"])
def test_a_spoilt_cache_block_is_drawn_again(tmp_path, caplog, spoil):
    drawn = make_stream(cache_dir=tmp_path).windows_at(1)
    (path,) = tmp_path.glob("stream-*.npy")
    block = np.load(path)
    if spoil == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif spoil == "reshape":
        np.save(path, block[:-1])
    else:
        np.save(path, np.where(np.arange(block.size).reshape(block.shape) == 7, 60000, block).astype(block.dtype))
    again = make_stream(cache_dir=tmp_path)
    np.testing.assert_array_equal(again.windows_at(1), drawn)
    assert again.tokens_drawn > 0 and "drawing" in caplog.text
    np.testing.assert_array_equal(np.load(path), block)  # replaced by the block drawn again


def reference_window_losses(model, windows):
    """Per-window mean next-token cross-entropy by hand in float64 (log-softmax written out)."""
    model = model.double().eval()
    out = []
    with torch.no_grad():
        for w in windows:
            logits = model(torch.from_numpy(w[None, :-1].astype(np.int64)))[0]
            logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
            out.append(-sum(logp[t, w[t + 1]].item() for t in range(len(w) - 1)) / (len(w) - 1))
    return np.array(out)


def test_memorisation_check_matches_a_float64_reference(stream):
    model = build_model(ModelConfig.preset("xs", n_layers=1, max_seq_len=64), seed=3)
    trained, fresh = stream.windows_at(0), stream.fresh_windows(6)
    result = memorisation_check(model, trained, fresh, batch_size=3, device="cpu")
    lt, lf = reference_window_losses(build_model(model.config, seed=3), trained), \
        reference_window_losses(build_model(model.config, seed=3), fresh)
    se = math.sqrt(np.var(lf, ddof=1) / len(lf) + np.var(lt, ddof=1) / len(lt))
    assert result["gap"] == pytest.approx(lf.mean() - lt.mean(), rel=1e-4, abs=1e-5)
    assert result["se"] == pytest.approx(se, rel=1e-3)
    assert (result["train_windows"], result["fresh_windows"], result["tokens_per_window"]) == (BATCH, 6, SEQ)
    same = memorisation_check(model, fresh, fresh, batch_size=4, device="cpu")
    assert same["gap"] == 0.0


def test_check_steps_spread_over_the_run():
    assert check_steps(80) == [5, 15, 25, 35, 45, 55, 65, 75]
    assert check_steps(3) == [0, 1, 2]


def run(out, **kw):
    cfg = TrainConfig(tokens=6 * BATCH * SEQ, batch_size=BATCH, seq_len=SEQ, warmup_steps=2, eval_every=3,
                      eval_tokens=4 * SEQ, save_every=2)
    val = make_stream(seed=9).fresh_windows(8).reshape(-1).astype(np.uint16)
    return train(ModelConfig.preset("xs", arch="diff", n_layers=2, max_seq_len=64), cfg, out, make_stream(), val,
                 **kw)


@pytest.mark.slow
def test_two_streamed_runs_from_one_seed_and_a_resumed_one_write_the_same_bytes(tmp_path):
    logs = {name: run(tmp_path / name) for name in ("a", "b")}
    run(tmp_path / "c", stop_at=3)
    logs["c"] = run(tmp_path / "c", resume=True)
    weights = {name: (tmp_path / name / "final" / "model.safetensors").read_bytes() for name in logs}
    assert weights["a"] == weights["b"] == weights["c"]
    assert logs["a"]["history"]["train_loss"] == logs["b"]["history"]["train_loss"] == \
        logs["c"]["history"]["train_loss"]
    memo = logs["a"]["memorisation"]
    assert memo["note"] == "streamed: none by construction" and memo["steps"] == check_steps(6)
    assert memo == logs["b"]["memorisation"]
    assert logs["c"]["memorisation"]["gap"] == pytest.approx(memo["gap"], abs=1e-9)  # redrawn after the resume
    assert logs["a"]["data"]["streamed"] is True and logs["a"]["data"]["stream"]["seed"] == 0


def test_a_resume_on_another_teacher_stream_is_refused(tmp_path):
    run(tmp_path / "r", stop_at=1)
    cfg = TrainConfig(tokens=6 * BATCH * SEQ, batch_size=BATCH, seq_len=SEQ, warmup_steps=2, eval_every=3,
                      eval_tokens=4 * SEQ, save_every=2)
    val = make_stream(seed=9).fresh_windows(8).reshape(-1).astype(np.uint16)
    with pytest.raises(ValueError, match="train_tokens_sha256"):
        train(ModelConfig.preset("xs", arch="diff", n_layers=2, max_seq_len=64), cfg, tmp_path / "r",
              make_stream(seed=5), val, resume=True)


def test_cli_teacher_errors_are_one_line_exit_2(tmp_path, capsys):
    args = ["train", "--arch", "diff", "--tokens", "1024", "--batch-size", "4", "--seq-len", "32"]
    assert main([*args, "--preset", "xs", "--out", str(tmp_path / "a"), "--teacher", str(tmp_path / "none")]) == 2
    assert main([*args, "--preset", "tiny", "--out", str(tmp_path / "b"),
                 "--teacher", str(stories260k_path())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "512 tokens" in err[1]


def test_gate_table_has_a_memorisation_column(tmp_path):
    import json

    from diffquant.study.gate import gate_table
    from diffquant.study.memorisation import memorisation_cell, memorisation_of

    logs = {}
    for arch, streamed, gap in (("transformer", True, 0.004), ("diff", True, -0.002)):
        logs[arch] = tmp_path / f"{arch}.json"
        logs[arch].write_text(json.dumps({"data": {"streamed": streamed},
                                          "memorisation": {"gap": gap, "se": 0.005}}))
    memo = memorisation_of({"train_logs": {k: str(v) for k, v in logs.items()}})
    row = {"pair": "p", "tokens": 10, "gate": True, "logit_top1": {"transformer": 1.0, "diff": 1.0},
           "ppl_growth_4bit": {"transformer": {}, "diff": {}}, "checkpoints": {"transformer": "t", "diff": "d"},
           "memorisation": memo}
    cell = gate_table([row]).splitlines()[-1].split("|")[-2].strip()
    assert cell == "streamed: none by construction (T 0.004 ± 0.005 / D -0.002 ± 0.005)"
    corpus = {a: {**m, "streamed": False} for a, m in memo.items()}
    assert memorisation_cell(corpus) == "T 0.004 ± 0.005 / D -0.002 ± 0.005"
    assert memorisation_cell({}) == "not measured"
    assert memorisation_of({"train_logs": {"diff": str(tmp_path / "missing.json")}}) == {}


def test_memorisation_table_counts_a_shared_arm_once_and_keeps_streamed_rows_apart(tmp_path):
    import json

    from diffquant.study.memorisation import memorisation_of, memorisation_table

    def log(name: str, gap: float | None, streamed: bool = False) -> str:
        record = {"tokens_seen": 400, "data": {"streamed": True} if streamed else {"corpus_tokens": 100}}
        if gap is not None:
            record["memorisation"] = {"gap": gap, "se": 0.01}
        (tmp_path / name).write_text(json.dumps(record))
        return str(tmp_path / name)

    def pair(budget: str, logs: dict[str, str]) -> dict:
        row = {"preset": "xs", "tokens": 400, "budget": budget, "train_logs": logs}
        return {**row, "memorisation": memorisation_of(row)}

    shared_t = log("t.json", 0.05)  # one Transformer set against two arms
    results = [pair("400 @ lr 3e-3", {"transformer": shared_t, "diff": log("d.json", 0.03)}),
               pair("400 @ lr 3e-3, constant λ_init 0.8", {"transformer": shared_t, "diff": log("l.json", 0.01)}),
               pair("400 @ lr 3e-3, real text", {"transformer": log("r.json", None), "diff": log("q.json", None)}),
               pair("400 @ lr 3e-3, streamed", {"transformer": log("st.json", 0.002, streamed=True),
                                                "diff": log("sd.json", -0.004, streamed=True)})]
    assert results[0]["memorisation"]["transformer"]["passes"] == 4.0
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in memorisation_table(results).splitlines()[2:]]
    assert rows == [["xs", "400 @ lr 3e-3", "corpus", "4.00", "3 of 5", "+0.030, +0.010 … +0.050", "0.04"],
                    ["xs", "400 @ lr 3e-3", "streamed", "—", "2 of 2", "-0.001, -0.004 … +0.002", "0.006"]]


def test_cli_corpus_run_with_a_teacher_logs_its_memorisation_check(tmp_path, capsys, small_corpus):
    import json

    corpus = small_corpus
    out = tmp_path / "run"
    assert main(["train", "--arch", "transformer", "--preset", "xs", "--tokens", "1024", "--batch-size", "4",
                 "--seq-len", "32", "--warmup-steps", "2", "--eval-tokens", "256", "--threads", "1",
                 "--data", str(corpus), "--teacher", str(stories260k_path()), "--stream-block-tokens", "256",
                 "--out", str(out)]) == 0
    log = json.loads((out / "train_log.json").read_text())
    memo = log["memorisation"]
    assert memo["note"] == "fixed corpus" and memo["steps"] == check_steps(8)
    assert memo["train_windows"] == memo["fresh_windows"] == 8 * 4 and memo["tokens_per_window"] == 32
    assert "streamed" not in log["data"] and log["data"]["corpus"] == str(corpus)


def test_memorisation_measured_after_training_equals_the_check_training_logs(tmp_path, small_corpus):
    """experiments/memorisation.py on a corpus run trained without a teacher gives the check that the same run,
    trained with --teacher, logged; gate.md reads it from beside the log."""
    import json
    from pathlib import Path

    from diffquant.study.memorisation import MEASURED_FILE, memorisation_of

    from .helpers import load_script

    repo = Path(__file__).resolve().parents[1]
    train = ["train", "--arch", "diff", "--preset", "xs", "--tokens", "1024", "--batch-size", "4", "--seq-len", "32",
             "--warmup-steps", "2", "--eval-tokens", "256", "--threads", "1", "--seed", "3",
             "--data", str(small_corpus)]
    teacher = str(stories260k_path())
    assert main([*train, "--teacher", teacher, "--stream-block-tokens", "256", "--out", str(tmp_path / "logged")]) == 0
    assert main([*train, "--out", str(tmp_path / "plain")]) == 0
    script = load_script(repo / "experiments" / "memorisation.py")
    records = script.main([str(tmp_path / "plain"), str(tmp_path / "logged"), "--teacher", teacher, "--draw", "8"])
    assert list(records) == [str(tmp_path / "plain")]  # the other's log has the check already
    logged = json.loads((tmp_path / "logged" / "train_log.json").read_text())["memorisation"]
    measured = json.loads((tmp_path / "plain" / MEASURED_FILE).read_text())
    assert measured["steps"] == logged["steps"] and measured["fresh_windows"] == logged["fresh_windows"] == 32
    for key in ("gap", "fresh_loss", "train_loss"):  # training checked its float32 model; the final is float16
        assert measured[key] == pytest.approx(logged[key], abs=1e-4), key
    memo = memorisation_of({"train_logs": {"diff": str(tmp_path / "plain" / "train_log.json")}})
    assert memo["diff"]["gap"] == measured["gap"] and memo["diff"]["streamed"] is False
