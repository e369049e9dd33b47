import json

import numpy as np
import pytest
import torch

import diffquant.train as tr
from diffquant import ModelConfig, load_checkpoint
from diffquant.cli import main
from diffquant.data import load_documents
from diffquant.train import TrainConfig, batch_at, lr_at, train


@pytest.fixture(scope="module")
def shakespeare_bytes():
    """Real text as byte-level token ids (< 128: the tiny preset's vocabulary)."""
    text = load_documents("tinyshakespeare")[0].text[:200_000]
    ids = np.frombuffer(text.encode("ascii", errors="ignore"), dtype=np.uint8).astype(np.uint16)
    return ids[:180_000], ids[180_000:]


def tiny_run(**overrides):
    base = dict(tokens=30 * 8 * 32, batch_size=8, seq_len=32, lr=3e-3, warmup_steps=5, eval_every=10,
                eval_tokens=2048, save_every=10, snapshots=(0.5, 1.0), seed=7)
    base.update(overrides)
    return TrainConfig(**base)


def test_thirty_steps_lower_the_loss_and_write_everything(tmp_path, shakespeare_bytes, arch):
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", arch=arch, attn_impl="sdpa")
    record = train(cfg, tiny_run(), tmp_path / "run", train_ids, val_ids)
    losses = record["history"]["train_loss"]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    val = record["history"]["val"]
    assert [v["step"] for v in val] == [10, 20, 30] and val[-1]["loss"] < val[0]["loss"]
    text = (tmp_path / "run" / "train_log.json").read_text()
    saved = json.loads(text)
    assert saved["history"]["train_loss"] == losses and saved["data"]["train_tokens_sha256"]
    assert text.count("\n") == len(saved) + 2  # one line per top-level key: a long history stays one compact line
    assert sorted(p.name for p in (tmp_path / "run" / "snapshots").iterdir()) == ["step000015", "step000030"]
    final = load_checkpoint(tmp_path / "run" / "final")
    assert final.config.arch == arch


def test_resume_after_interrupt_is_bit_identical(tmp_path, shakespeare_bytes, monkeypatch):
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", arch="diff", attn_impl="sdpa")
    run_cfg = tiny_run(tokens=16 * 8 * 32)
    straight = train(cfg, run_cfg, tmp_path / "a", train_ids, val_ids)

    real_step = tr._train_step

    def interrupt_at_9(model, opt, cfg_, data, step):
        if step == 9:
            raise KeyboardInterrupt
        return real_step(model, opt, cfg_, data, step)

    monkeypatch.setattr(tr, "_train_step", interrupt_at_9)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_cfg, tmp_path / "b", train_ids, val_ids)
    monkeypatch.setattr(tr, "_train_step", real_step)
    resumed = train(cfg, run_cfg, tmp_path / "b", train_ids, val_ids, resume=True)
    assert resumed["history"]["train_loss"] == straight["history"]["train_loss"]
    a = tr.load_state(tmp_path / "a", "cpu")[0].state_dict()
    b = tr.load_state(tmp_path / "b", "cpu")[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stop_at_then_resume_is_bit_identical(tmp_path, shakespeare_bytes):
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", arch="diff", attn_impl="sdpa")
    run_cfg = tiny_run(tokens=16 * 8 * 32, schedule="cosine", save_every=4)
    straight = train(cfg, run_cfg, tmp_path / "a", train_ids, val_ids)
    paused = train(cfg, run_cfg, tmp_path / "b", train_ids, val_ids, stop_at=7)
    assert paused["step"] == 7 and len(paused["history"]["train_loss"]) == 7
    assert not (tmp_path / "b" / "final").exists() and tr.load_state(tmp_path / "b", "cpu")[2] == 7
    again = train(cfg, run_cfg, tmp_path / "b", train_ids, val_ids, resume=True, stop_at=5)  # already past: no-op
    assert again["step"] == 7 and tr.load_state(tmp_path / "b", "cpu")[2] == 7
    resumed = train(cfg, run_cfg, tmp_path / "b", train_ids, val_ids, resume=True)
    assert resumed["history"]["train_loss"] == straight["history"]["train_loss"]
    a = load_checkpoint(tmp_path / "a" / "final").state_dict()
    b = load_checkpoint(tmp_path / "b" / "final").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_refuses_another_run_but_a_constant_schedule_may_grow(tmp_path, shakespeare_bytes):
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", attn_impl="sdpa")
    for schedule in ("cosine", "constant"):
        out = tmp_path / schedule
        train(cfg, tiny_run(tokens=12 * 8 * 32, schedule=schedule), out, train_ids, val_ids, stop_at=4)
        for changed, words in ((dict(lr=1e-3), r"lr 0.003 \(asked 0.001\)"), (dict(seed=8), r"seed 7 \(asked 8\)"),
                               (dict(schedule="linear" if schedule == "cosine" else "cosine"), "schedule")):
            with pytest.raises(ValueError, match=words):
                train(cfg, tiny_run(**{"tokens": 12 * 8 * 32, "schedule": schedule, **changed}), out, train_ids,
                      val_ids, resume=True)
        with pytest.raises(ValueError, match="other train tokens"):
            train(cfg, tiny_run(tokens=12 * 8 * 32, schedule=schedule), out, train_ids[1:], val_ids, resume=True)
        longer = tiny_run(tokens=16 * 8 * 32, schedule=schedule)
        if schedule == "cosine":  # more steps would re-draw its decay under the steps already taken
            with pytest.raises(ValueError, match="tokens 3072"):
                train(cfg, longer, out, train_ids, val_ids, resume=True)
        else:
            assert train(cfg, longer, out, train_ids, val_ids, resume=True)["step"] == 16
    assert tr.load_state(tmp_path / "cosine", "cpu")[2] == 4  # the refused resumes left the state as it was


@pytest.mark.parametrize("schedule, unread, read", [
    ("constant", dict(cooldown_frac=0.5, min_lr_ratio=0.5, decay_start=3), None),
    ("cosine", dict(cooldown_frac=0.5, decay_start=3), dict(min_lr_ratio=0.5)),
    ("wsd", dict(), dict(cooldown_frac=0.5))])
def test_a_resume_ignores_only_what_its_schedule_never_reads(tmp_path, shakespeare_bytes, schedule, unread, read):
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", attn_impl="sdpa")
    run = dict(tokens=8 * 8 * 32, schedule=schedule)
    train(cfg, tiny_run(**run), tmp_path, train_ids, val_ids, stop_at=4)
    if read:
        key = next(iter(read))
        with pytest.raises(ValueError, match=key):
            train(cfg, tiny_run(**run, **read), tmp_path, train_ids, val_ids, resume=True)
    assert train(cfg, tiny_run(**run, **unread), tmp_path, train_ids, val_ids, resume=True)["step"] == 8


def test_init_from_continues_from_given_weights(tmp_path, shakespeare_bytes):
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", attn_impl="sdpa")
    first = train(cfg, tiny_run(tokens=10 * 8 * 32, eval_every=5), tmp_path / "a", train_ids, val_ids)
    more = train(cfg, tiny_run(tokens=5 * 8 * 32, warmup_steps=1, lr=1e-3, eval_every=5), tmp_path / "b",
                 train_ids, val_ids, init_from=tmp_path / "a" / "final")
    assert more["history"]["val"][0]["loss"] < first["history"]["val"][0]["loss"]
    assert more["init_from"].endswith("final")


def test_batches_depend_only_on_seed_and_step(shakespeare_bytes):
    ids = shakespeare_bytes[0]
    cfg = tiny_run()
    x1, y1 = batch_at(ids, 3, cfg)
    x2, _ = batch_at(ids, 3, cfg)
    x3, _ = batch_at(ids, 4, cfg)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1]) and x1.shape == (8, 32)


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = tiny_run(tokens=100 * 8 * 32, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)
    lin = tiny_run(tokens=100 * 8 * 32, warmup_steps=10, lr=1.0, schedule="linear")
    assert lr_at(55, lin) == pytest.approx(0.1 + 0.9 * 0.5, abs=1e-2)


def test_bad_inputs(tmp_path, shakespeare_bytes, capsys):
    with pytest.raises(ValueError, match="smaller than one batch"):
        TrainConfig(tokens=100, batch_size=8, seq_len=32)
    with pytest.raises(ValueError, match="fewer than one window"):
        batch_at(np.arange(10, dtype=np.uint16), 0, tiny_run())
    train_ids, val_ids = shakespeare_bytes
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    with pytest.raises(FileExistsError, match="not empty"):
        train(ModelConfig.preset("tiny"), tiny_run(), tmp_path / "busy", train_ids, val_ids)
    assert (tmp_path / "busy" / "x").read_text() == "keep me"
    with pytest.raises(ValueError, match="positive step"):
        train(ModelConfig.preset("tiny"), tiny_run(), tmp_path / "r", train_ids, val_ids, stop_at=0)
    assert main(["train", "--arch", "diff", "--preset", "huge", "--tokens", "10000", "--out", str(tmp_path / "o")]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["train", "--arch", "diff", "--preset", "tiny", "--tokens", "5", "--out", str(tmp_path / "o")]) == 2
    assert "smaller than one batch" in capsys.readouterr().err


def test_wsd_and_constant_schedules():
    wsd = tiny_run(tokens=100 * 8 * 32, warmup_steps=10, lr=1.0, min_lr_ratio=0.1, schedule="wsd", cooldown_frac=0.2)
    assert wsd.decay_step == 80
    assert lr_at(10, wsd) == lr_at(79, wsd) == 1.0
    assert lr_at(80, wsd) == 1.0 and lr_at(90, wsd) == pytest.approx(0.55) and lr_at(99, wsd) < 0.2
    const = tiny_run(tokens=100 * 8 * 32, warmup_steps=10, lr=1.0, schedule="constant")
    assert {lr_at(s, const) for s in range(10, 100)} == {1.0}
    assert tiny_run(tokens=100 * 8 * 32, schedule="wsd", decay_start=60).decay_step == 60


def test_cooldown_branch_continues_the_stable_run(tmp_path, shakespeare_bytes, monkeypatch):
    """A stable run keeps states; a branch from step 10 resumes it exactly and decays over its own steps."""
    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", arch="diff", attn_impl="sdpa")
    stable = tiny_run(tokens=20 * 8 * 32, schedule="constant", branch_every=10)
    long = train(cfg, stable, tmp_path / "stable", train_ids, val_ids)
    assert sorted(p.name for p in (tmp_path / "stable" / "branches").iterdir()) == ["step000010"]
    branch_cfg = tiny_run(tokens=16 * 8 * 32, schedule="wsd", decay_start=10)
    seen = []
    real = tr._train_step

    def spy(model, opt, cfg_, data, step):
        loss = real(model, opt, cfg_, data, step)
        seen.append((step, opt.param_groups[0]["lr"]))
        return loss

    monkeypatch.setattr(tr, "_train_step", spy)
    branch = train(cfg, branch_cfg, tmp_path / "cool", train_ids, val_ids,
                   branch_from=tmp_path / "stable" / "branches" / "step000010")
    monkeypatch.setattr(tr, "_train_step", real)
    assert [s for s, _ in seen] == list(range(10, 16))
    assert [lr for _, lr in seen] == pytest.approx([lr_at(s, branch_cfg) for s in range(10, 16)])
    assert seen[0][1] == pytest.approx(3e-3) and seen[-1][1] < seen[0][1] * 0.3
    # the first ten losses are the stable run's, and so is step 10's (same state, same batch, same lr)
    assert branch["history"]["train_loss"][:11] == long["history"]["train_loss"][:11]
    assert branch["branch_from"].endswith("step000010")
    with pytest.raises(ValueError, match="other lr"):
        train(cfg, tiny_run(tokens=16 * 8 * 32, lr=1e-2, schedule="wsd", decay_start=10), tmp_path / "bad",
              train_ids, val_ids, branch_from=tmp_path / "stable" / "branches" / "step000010")


def test_tracked_outliers_equal_profile_on_the_same_batch(tmp_path, shakespeare_bytes):
    from diffquant import profile
    from diffquant.train import eval_windows

    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", arch="diff", attn_impl="sdpa")
    record = train(cfg, tiny_run(tokens=10 * 8 * 32, track_every=5), tmp_path / "run", train_ids, val_ids)
    points = record["history"]["outliers"]
    assert [p["step"] for p in points] == [0, 5, 10]
    model = tr.load_state(tmp_path / "run", "cpu")[0]
    batch = eval_windows(val_ids, 32, 2048)[:4, :-1]
    report = profile(model, [batch], sites=("attn_logits", "hidden"), topk=10, progress=False)
    for layer, point in zip(report.data["layers"], points[-1]["layers"], strict=True):
        for site in ("attn_logits", "hidden"):
            assert point[site]["top1"] == layer[site]["top"][0]
            assert point[site]["top10"] == layer[site]["top"][9]
            assert point[site]["median"] == layer[site]["median"]
        assert point["attn_logits"]["at"]["map"] in (0, 1) and "first_token" in point["attn_logits"]["at"]
        lam = model.layers[layer["layer"]].attn.lambda_full().item()
        assert point["lambda"] == pytest.approx(lam)


def test_divergence_is_detected_logged_and_one_line(tmp_path, shakespeare_bytes, monkeypatch):
    from diffquant import build_model

    train_ids, val_ids = shakespeare_bytes
    cfg = ModelConfig.preset("tiny", attn_impl="sdpa")
    model = build_model(cfg)
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight.fill_(float("nan"))
    run_cfg = tiny_run()
    with pytest.raises(tr.TrainingDiverged, match="diverged at step 0"):
        tr._train_step(model, tr.make_optimizer(model, run_cfg), run_cfg, train_ids, 0)
    real = tr._train_step

    def blow_up_at_4(model_, opt, cfg_, data, step):
        if step == 4:
            raise tr.TrainingDiverged("training diverged at step 4: loss is nan")
        return real(model_, opt, cfg_, data, step)

    monkeypatch.setattr(tr, "_train_step", blow_up_at_4)
    with pytest.raises(tr.TrainingDiverged):
        train(cfg, run_cfg, tmp_path / "run", train_ids, val_ids)
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert log["history"]["diverged_at"] == 4 and len(log["history"]["train_loss"]) == 4


@pytest.mark.slow  # ≥ 9 s (pytest --durations)
def test_cli_tiny_preset_trains_on_the_calib_split_with_its_tokenizers_vocabulary(tmp_path, caplog):
    """`train --preset tiny` (vocab 128) on the calib split (an 8192-token tokenizer) widens the vocabulary."""
    out = tmp_path / "tiny"
    argv = ["train", "--arch", "transformer", "--preset", "tiny", "--tokens", "512", "--batch-size", "4",
            "--seq-len", "32", "--eval-every", "4", "--eval-tokens", "256", "--save-every", "4", "--out", str(out)]
    with caplog.at_level("WARNING"):
        assert main(argv) == 0
    assert "training with vocab_size 8192" in caplog.text
    assert load_checkpoint(out / "final").config.vocab_size == 8192
    header = json.loads((out / "train_log.json").read_text())
    assert header["flush_denormal"] is True  # the command flushes denormals while it trains (outlier-regime speed)
    assert torch.tensor([1e-40]).item() != 0.0  # and gives the process torch's default back


def test_in_process_cli_keeps_an_explicit_lr_over_the_recipe(tmp_path, monkeypatch):
    """``cli.main([...])`` decides what the user set from its own argv, never from the process's sys.argv."""
    import diffquant.train as train_module

    seen = {}

    def fake_train(model_cfg, cfg, out, *args, **kwargs):
        seen[out] = cfg
        return {"step": 0, "tokens_seen": 0, "history": {"val": []}}

    monkeypatch.setattr(train_module, "train", fake_train)
    monkeypatch.setattr("sys.argv", ["pytest", "--recipe", "stories260k"])  # a caller's argv, not the command's
    common = ["train", "--arch", "diff", "--preset", "tiny", "--tokens", "8192", "--batch-size", "4",
              "--recipe", "stories260k"]
    assert main([*common, "--lr", "1e-2", "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--beta2=0.9", "--out", str(tmp_path / "b")]) == 0
    a, b = seen[str(tmp_path / "a")], seen[str(tmp_path / "b")]
    assert (a.lr, a.beta2, a.weight_decay) == (1e-2, 0.99, 0.01)  # lr given; the rest from the recipe
    assert (b.lr, b.beta2) == (1e-3, 0.9)


def test_compact_json_object_round_trips_and_refuses_nan():
    from diffquant.io import compact_json_object

    rng = np.random.default_rng()
    data = {"config": {"lr": float(rng.random()), "arch": "diff"}, "history": {"loss": rng.random(50).tolist(),
            "val": [{"step": int(s), "loss": float(rng.random())} for s in rng.integers(0, 999, 4)]}, "seed": None}
    text = compact_json_object(data)
    assert json.loads(text) == data and text.count("\n") == len(data) + 2
    with pytest.raises(ValueError):
        compact_json_object({"loss": float("nan")})
