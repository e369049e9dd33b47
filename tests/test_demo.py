"""`diffquant demo` end to end on tiny saved models (the real run uses the shipped pair; see README)."""

import hashlib
import json

import pytest

from diffquant import build_model, save_checkpoint
from diffquant.cli import main

from .conftest import tiny_config


@pytest.mark.slow
def test_demo_writes_tables_records_and_plots(tmp_path, capsys):
    pair = []
    for arch in ("transformer", "diff"):
        path = tmp_path / f"{arch}-tiny" / "final"
        save_checkpoint(build_model(tiny_config(arch, vocab_size=8192, max_seq_len=64), seed=1), path)
        pair.append(str(path))
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--pair", *pair, "--profile-windows", "4",
                 "--ppl-windows", "2", "--tasks", "tinystories,test", "--calib-tokens", "128"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "attention logits" in printed and "Transformer/Diff" in printed and "16 bit" in printed
    assert "gate (T top-1" in printed
    outliers = json.loads((out / "outliers.json").read_text())
    assert outliers["diff"]["sites"]["attn_logits"]["count"] > 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["target"] for r in records} == {None, "attn_logits", "weights-rtn", "weights-gptq", "linear_inputs"}
    assert {r["granularity"] for r in records if r["target"] == "attn_logits"} == {"sequence", "head", "head_map"}
    assert {r["task"] for r in records} == {"tinystories", "test"}
    stories = [r for r in records if r["checkpoint"].endswith("stories260K.gguf")]  # the gate's reference
    assert {r["bits"] for r in stories} == {16, 4} and {r["metrics"]["windows"] for r in stories} == {2}
    assert "stories260K" in outliers
    summary = json.loads((out / "summary.json").read_text())
    tr_top1 = outliers["transformer"]["sites"]["attn_logits"]["top"][0]
    assert summary["verdict"]["logit_top1"]["transformer"] == tr_top1
    assert summary["verdict"]["gate"] == (tr_top1 >= 100 and summary["verdict"]["ppl_growth_4bit"]["transformer"][
        "sequence"] >= 2)  # random tiny models: the gate is computed, whichever way it falls
    for name in ("outliers.md", "outliers-layers.png", "outliers-hist.png", "degradation.md", "figure8.png",
                 "gate.md", "summary.json"):
        assert (out / name).stat().st_size > 0


def test_demo_without_the_shipped_models_is_a_one_line_error(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "d"), "--pair", str(tmp_path / "a"), str(tmp_path / "b")])
    assert code == 2
    err = capsys.readouterr().err
    assert "not found" in err and err.count("\n") == 1


def test_demo_pair_of_one_arch_is_a_one_line_error(tmp_path, capsys):
    pair = []
    for name in ("a", "b"):
        path = tmp_path / name / "final"
        save_checkpoint(build_model(tiny_config("transformer", vocab_size=8192, max_seq_len=64), seed=1), path)
        pair.append(str(path))
    code = main(["demo", "--out", str(tmp_path / "d"), "--pair", *pair])
    assert code == 2
    err = capsys.readouterr().err
    assert "both models are transformer" in err and err.count("\n") == 1
    assert not (tmp_path / "d").exists()


# -- the registered pairs (calib/models/pairs.json) --------------------------------------------------------------

def test_every_registered_pair_is_shipped_as_registered(capsys):
    from diffquant.pairs import pair_problem, registered_pairs, resolve_pair

    pairs, default = registered_pairs()
    assert default == "xs" and {"xs", "small-books"} <= set(pairs)
    problems = {name: pair_problem(pair) for name, pair in pairs.items()}
    assert problems["xs"] is None and resolve_pair().paths["transformer"].name == "final"
    for name, problem in problems.items():  # a parked pair is here as registered, or missing with its restore command
        assert problem is None or "is missing (restore it: bash experiments/campaign/restore_states.sh" in problem, name
    assert main(["demo", "--list"]) == 0
    listed = capsys.readouterr().out
    assert listed.count("ready (sha256 checked)") == list(problems.values()).count(None) and "xs (default)" in listed


def test_a_parked_pair_says_how_to_restore_it_and_gives_relative_paths(tmp_path, monkeypatch):
    import diffquant.pairs as registry
    from diffquant.errors import UserError

    for arch in ("transformer", "diff"):
        save_checkpoint(build_model(tiny_config(arch, vocab_size=8192, max_seq_len=64), seed=1), tmp_path / "m" / arch)
    sha = {a: hashlib.sha256((tmp_path / "m" / a / "model.safetensors").read_bytes()).hexdigest()
           for a in ("transformer", "diff")}
    entry = {a: {"path": f"m/{a}", "sha256": sha[a]} for a in ("transformer", "diff")}
    (tmp_path / "pairs.json").write_text(json.dumps({"pairs": {"mine": {**entry, "restore": "bash restore.sh mine"}}}))
    monkeypatch.setattr(registry, "registry_path", lambda: tmp_path / "pairs.json")
    assert registry.pair_checkpoints("mine", relative_to=tmp_path) == ["m/transformer", "m/diff"]
    (tmp_path / "m" / "diff" / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"diff model .* is missing \(restore it: bash restore.sh mine\)$"):
        registry.pair_checkpoints("mine")


def test_a_pair_is_refused_by_an_unknown_name_or_changed_weights(tmp_path, capsys, monkeypatch):
    import diffquant.pairs as registry

    assert main(["demo", "--out", str(tmp_path / "d"), "--pair", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no pair named 'nope'" in err and "xs" in err and err.count("\n") == 1
    for arch in ("transformer", "diff"):
        save_checkpoint(build_model(tiny_config(arch, vocab_size=8192, max_seq_len=64), seed=1), tmp_path / arch)
    (tmp_path / "pairs.json").write_text(json.dumps({"default": "mine", "pairs": {"mine": {
        arch: {"path": arch, "sha256": "0" * 64} for arch in ("transformer", "diff")}}}))
    monkeypatch.setattr(registry, "registry_path", lambda: tmp_path / "pairs.json")
    assert main(["demo", "--out", str(tmp_path / "d"), "--pair", "mine"]) == 2
    err = capsys.readouterr().err
    assert "sha256 differs" in err and err.count("\n") == 1
    assert not (tmp_path / "d").exists()


# -- the job itself, in process (diffquant.study.demo) -------------------------------------------------------------

def test_run_demo_in_process_shows_its_tables_and_writes_the_files(tmp_path, capsys):
    from diffquant.study.demo import demo_pair, demo_tasks, run_demo

    paths = []
    for arch in ("diff", "transformer"):  # either order: the pair is keyed by arch
        path = tmp_path / f"{arch}-tiny" / "final"
        save_checkpoint(build_model(tiny_config(arch, vocab_size=8192, max_seq_len=64), seed=1), path)
        paths.append(str(path))
    pair = demo_pair(paths)
    assert pair == {"pair": "tiny", "tokens": None, "checkpoints": {"transformer": paths[1], "diff": paths[0]}}
    tasks = demo_tasks(["tinystories", "copa"], ppl_windows=2, limit=3)
    assert tasks == {"tinystories": 2, "copa": 3}
    shown = []
    summary = run_demo(pair, tmp_path / "demo", tasks={"tinystories": 1}, stories=False, profile_windows=1,
                       calib_tokens=64, show=shown.append)
    assert capsys.readouterr().out == ""  # shown through `show` only
    assert shown[0].startswith("== Outliers") and any("Transformer/Diff" in s for s in shown)
    assert shown[-1].startswith("== The gate") and "gate (T top-1" in shown[-1]
    out = tmp_path / "demo"
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["out"] == str(out) and summary["verdict"]["pair"] == "tiny"
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["target"] for r in records} == {None, "attn_logits", "weights-rtn", "weights-gptq", "linear_inputs"}
    assert not any(r["checkpoint"].endswith("stories260K.gguf") for r in records)
    assert "stories260K" not in json.loads((out / "outliers.json").read_text())
    assert (out / "gate.md").read_text() == shown[-1].split("\n\n", 1)[1].rstrip("\n") + "\n"
