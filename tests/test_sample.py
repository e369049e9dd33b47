"""The teacher corpus: exact ancestral sampling, byte-identical shards, resume, corpus reading, bad input."""

import json
import math
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from diffquant.checkpoint.gguf import load_gguf, stories260k_path, stories260k_tokenizer_path
from diffquant.cli import main
from diffquant.corpus import heldout_ids, load_corpus, read_manifest
from diffquant.sample import draw, sample_corpus, sample_stories
from diffquant.tokenizer import Tokenizer

BOS, STOPS = 1, [1, 2]


@pytest.fixture(scope="module")
def teacher():
    return load_gguf(stories260k_path()).set_attn_impl("sdpa").eval()


def full_recompute_sampler(model, n, generator, max_len):
    """An independent reference: the same batch bookkeeping, but every step re-runs the whole prefix."""
    rows, live = list(range(n)), [True] * n
    seqs = [[BOS] for _ in range(n)]  # per batch row, including tokens drawn after the story ended
    stories = {}
    for length in range(1, max_len):
        with torch.no_grad():
            logits = model(torch.tensor(seqs))[:, -1]
        nxt = draw(logits, generator)[:, 0].tolist()
        for j, tok in enumerate(nxt):
            if live[j] and tok in STOPS:
                stories[rows[j]] = seqs[j][:length]
                live[j] = False
            seqs[j].append(tok)
        if not any(live):
            break
        if live.count(False) * 4 >= len(live):
            keep = [j for j in range(len(rows)) if live[j]]
            rows, live, seqs = [rows[j] for j in keep], [True] * len(keep), [seqs[j] for j in keep]
    for j, r in enumerate(rows):
        if live[j]:
            stories[r] = seqs[j][:max_len]
    return [stories[i] for i in range(n)]


def test_kv_cache_sampling_equals_full_recomputation(teacher):
    fast = sample_stories(teacher, 6, torch.Generator().manual_seed(5), BOS, STOPS, max_len=48)
    slow = full_recompute_sampler(teacher, 6, torch.Generator().manual_seed(5), max_len=48)
    assert [s.tolist() for s in fast] == slow
    assert all(s[0] == BOS and BOS not in s[1:] for s in fast)


def test_samples_are_exact_draws_from_the_teacher(teacher):
    """For exact sampling E[-log p(x_t)] = E[H(p_t)] at every position: mean NLL equals mean entropy."""
    stories = sample_stories(teacher, 48, torch.Generator().manual_seed(11), BOS, STOPS, max_len=96)
    gaps = []
    for s in stories:
        ids = torch.tensor(s, dtype=torch.long)[None]
        with torch.no_grad():
            logp = torch.log_softmax(teacher(ids)[0].double(), -1)  # (T, V)
        entropy = -(logp.exp() * logp).sum(-1)[:-1]
        nll = -logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
        gaps.append(nll - entropy)
    gaps = torch.cat(gaps)
    sem = gaps.std() / math.sqrt(len(gaps))
    assert len(gaps) > 2000
    assert abs(gaps.mean()) < 4 * sem, (gaps.mean(), sem)
    # the test has power: a temperature-0.8 sampler's samples would fail it
    cold = sample_stories(_scaled(teacher, 1 / 0.8), 48, torch.Generator().manual_seed(11), BOS, STOPS, 96)
    cold_gap = []
    for s in cold:
        ids = torch.tensor(s, dtype=torch.long)[None]
        with torch.no_grad():
            logp = torch.log_softmax(teacher(ids)[0].double(), -1)
        cold_gap.append(-logp[:-1].gather(1, ids[0, 1:, None])[:, 0] + (logp.exp() * logp).sum(-1)[:-1])
    assert torch.cat(cold_gap).mean() < -8 * sem


def _scaled(model, factor):
    import copy

    scaled = copy.deepcopy(model)
    with torch.no_grad():
        scaled.head.weight.mul_(factor)
    return scaled


def test_draw_inverts_the_cdf_exactly():
    logits = torch.tensor([[0.0, -math.inf, 0.0, math.log(2.0)]]).expand(40000, 4)
    counts = torch.bincount(draw(logits, torch.Generator().manual_seed(0))[:, 0], minlength=4).double()
    assert counts[1] == 0
    assert torch.allclose(counts / counts.sum(), torch.tensor([0.25, 0, 0.25, 0.5], dtype=torch.float64), atol=0.01)


@pytest.mark.slow  # ≥ 9 s (pytest --durations)
def test_corpus_same_seed_same_bytes_resume_and_regeneration(tmp_path):
    kw = dict(tokens=3000, seed=3, batch_size=8, max_len=64, shard_tokens=1000, progress=False)
    a = sample_corpus(stories260k_path(), tmp_path / "a", **kw)
    b = sample_corpus(stories260k_path(), tmp_path / "b", **kw)
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]] and len(a["shards"]) == 3
    assert all((tmp_path / "a" / s["file"]).read_bytes() == (tmp_path / "b" / s["file"]).read_bytes()
               for s in a["shards"])
    other = sample_corpus(stories260k_path(), tmp_path / "c", **{**kw, "seed": 4})
    assert other["shards"][0]["sha256"] != a["shards"][0]["sha256"]
    # a missing shard is redrawn byte for byte; a longer corpus extends the shorter one
    (tmp_path / "a" / "shard_00001.bin").unlink()
    again = sample_corpus(stories260k_path(), tmp_path / "a", **{**kw, "tokens": 4000})
    assert [s["sha256"] for s in again["shards"][:3]] == [s["sha256"] for s in a["shards"]]
    assert len(again["shards"]) == 4
    corpus = load_corpus(tmp_path / "a", vocab_size=512)
    assert corpus.ids.dtype == np.uint16 and corpus.ids.size == again["tokens"] and corpus.ids[0] == BOS
    assert corpus.tokenizer_path.name == "tokenizer.model"
    manifest = read_manifest(tmp_path / "a")
    assert manifest["teacher_sha256"] and manifest["stories"] == int((corpus.ids == BOS).sum())
    older = {**manifest, "precision": "float32"}  # a corpus drawn otherwise is never mixed with new shards
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match="other settings \\(precision\\)"):
        sample_corpus(stories260k_path(), tmp_path / "a", **kw)


def test_heldout_is_real_cased_text_with_bos():
    tok = Tokenizer.load(stories260k_tokenizer_path())
    ids = heldout_ids(tok)
    assert ids[0] == BOS and ids.size > 10_000
    assert tok.decode(ids[1:20].tolist()).startswith("One day, a little girl named Lily")


def test_bad_input_is_one_line(tmp_path, capsys):
    from diffquant import ModelConfig, build_model, save_checkpoint
    from diffquant.checkpoint import load_checkpoint
    from diffquant.gguf_export import save_gguf

    bare = tmp_path / "bare.gguf"  # no vocabulary inside, no SentencePiece model beside it
    save_gguf(load_checkpoint(stories260k_path()), bare)
    assert main(["sample", str(bare), "--tokens", "100", "--out", str(tmp_path / "o")]) == 2
    assert "embeds no vocabulary" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    assert main(["train", "--arch", "diff", "--preset", "xs", "--tokens", "10000", "--data", str(bad),
                 "--out", str(tmp_path / "r")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    sample_corpus(stories260k_path(), tmp_path / "c", tokens=500, batch_size=4, max_len=32, shard_tokens=500,
                  progress=False)
    assert main(["train", "--arch", "diff", "--preset", "tiny", "--tokens", "10000", "--data", str(tmp_path / "c"),
                 "--out", str(tmp_path / "r")]) == 2
    assert "vocabulary of 512 tokens; the model has only 128" in capsys.readouterr().err
    assert main(["train", "--arch", "diff", "--preset", "xs", "--tokens", "10000", "--out", str(tmp_path / "r")]) == 2
    assert "token corpus" in capsys.readouterr().err
    shard = tmp_path / "c" / "shard_00000.bin"
    good = shard.read_bytes()
    shard.write_bytes(good[:-2])
    with pytest.raises(ValueError, match="holds 1022 bytes; the manifest says 512 uint16 tokens"):
        load_corpus(tmp_path / "c")
    shard.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(ValueError, match="sha256"):
        load_corpus(tmp_path / "c")
    shard.unlink()  # a missing shard: redrawn from the manifest's command, or restored where the manifest says so
    with pytest.raises(FileNotFoundError, match="lacks 1 of its 1 shards; regenerate them with: diffquant sample"):
        load_corpus(tmp_path / "c")
    manifest = read_manifest(tmp_path / "c")
    (tmp_path / "c" / "manifest.json").write_text(json.dumps({**manifest, "restore": "bash restore.sh c"}))
    with pytest.raises(FileNotFoundError, match="lacks 1 of its 1 shards; restore them with: bash restore.sh c$"):
        load_corpus(tmp_path / "c")
    save_checkpoint(build_model(ModelConfig.preset("tiny")), tmp_path / "ckpt")  # no tokenizer of its own
    assert main(["sample", str(tmp_path / "ckpt"), "--tokens", "100", "--out", str(tmp_path / "o2")]) == 2
    assert "does not fit its vocabulary (128)" in capsys.readouterr().err


def test_training_on_a_corpus_ships_its_tokenizer(tmp_path):
    from diffquant.tokenizer import tokenizer_for

    sample_corpus(stories260k_path(), tmp_path / "c", tokens=3000, batch_size=8, max_len=64, shard_tokens=3000,
                  progress=False)
    assert main(["train", "--arch", "diff", "--preset", "xs", "--data", str(tmp_path / "c"), "--tokens", "256",
                 "--batch-size", "2", "--seq-len", "64", "--eval-tokens", "512", "--track-every", "1",
                 "--out", str(tmp_path / "run")]) == 0
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert log["data"]["validation"] == "tinystories-cased" and len(log["data"]["corpus_shards_sha256"]) == 1
    tok = tokenizer_for(tmp_path / "run" / "final")
    assert tok.kind == "sentencepiece" and tok.vocab_size == 512
    assert (tmp_path / "run" / "state" / "model" / "tokenizer.model").is_file()


def test_a_background_training_stopped_by_sigterm_saves_its_state(tmp_path):
    """kill (SIGTERM) of a trainer started with & (SIGINT ignored) keeps the step it reached, as Ctrl-C does."""
    sample_corpus(stories260k_path(), tmp_path / "c", tokens=3000, batch_size=8, max_len=64, shard_tokens=3000,
                  progress=False)
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "diffquant", "train", "--arch", "diff", "--preset", "xs", "--data",
            str(tmp_path / "c"), "--tokens", "1000000", "--batch-size", "2", "--seq-len", "64", "--eval-tokens", "512",
            "--save-every", "1", "--threads", "1", "--out", str(run)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.time() + 120
    while not (run / "state" / "trainer.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    state = json.loads((run / "state" / "trainer.json").read_text())
    log = json.loads((run / "train_log.json").read_text())
    assert state["step"] == log["step"] == len(log["history"]["train_loss"]) > 0
    assert not (run / "final").exists()
