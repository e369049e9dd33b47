"""Sweeps on tiny saved checkpoints (both archs): records, resume, equality with plain evaluation, CLI errors;
and the lm-eval adapter (tests run only where lm_eval imports)."""
import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffquant as dq
import diffquant.sweep as sweep
from diffquant.calibration import calibration_batch
from diffquant.cli import main
from diffquant.data import calib_dir, documents
from diffquant.evaluate import evaluate_task, perplexity_metrics, score_multiple_choice, text_perplexity
from diffquant.quant import ActQuant, QuantConfig, WeightQuant, quantize_model
from diffquant.records import read_records, record_key
from diffquant.report import degradation_rows
from diffquant.sweep import resolve_task, run_sweep
from diffquant.tasks import load_task
from diffquant.tokenizer import tokenizer_for

from .conftest import tiny_config
from .helpers import randomize_

FIXTURES = calib_dir() / "eval" / "fixtures"
LAMBADA = f"lambada:{FIXTURES / 'lambada_small.jsonl'}"
TIMING = ("wall_time_s", "quantize_s", "created")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two tiny checkpoints with the project's vocabulary and a 362-token text file (12 windows of 32)."""
    root = tmp_path_factory.mktemp("sweep")
    torch.manual_seed(0)
    ckpts = {}
    for arch in ("transformer", "diff"):
        model = randomize_(dq.build_model(tiny_config(arch, vocab_size=8192, max_seq_len=32)))
        ckpts[arch] = str(dq.save_checkpoint(model, root / f"tiny-{arch}"))
    text = root / "text.txt"
    text.write_text(documents("tinyshakespeare")[0].text[:1200])
    return ckpts, str(text), root


def _sweep(setup, out, **kw):
    ckpts, text, _ = setup
    args = dict(target="attn_logits", bits=[16, 8, 4], tasks=[text, "copa", LAMBADA], limit=4, progress=False)
    args.update(kw)
    return run_sweep([ckpts["transformer"], ckpts["diff"]], out, **args)


def _untimed(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


@pytest.fixture(scope="module")
def full(setup):
    out = setup[2] / "full.jsonl"
    summary = _sweep(setup, out)
    return summary, read_records(out)


def _eager(path):
    return dq.load_checkpoint(path, attn_impl="eager")


# ------------------------------------------------------------------------------------------------ records

def test_one_record_per_checkpoint_bits_and_task(setup, full):
    ckpts, text, _ = setup
    summary, records = full
    assert summary["written"] == 18 and summary["skipped"] == 0
    assert len({record_key(r) for r in records}) == 18
    cells = {(r["checkpoint"], r["bits"], r["task"]) for r in records}
    assert cells == {(c, b, t) for c in ckpts.values() for b in (16, 8, 4) for t in (text, "copa", LAMBADA)}
    for r in records:
        assert r["arch"] == ("diff" if r["checkpoint"].endswith("diff") else "transformer")
        assert r["model"]["arch"] == r["arch"] and r["model"]["vocab_size"] == 8192
        assert r["label"] == Path(r["checkpoint"]).name and r["limit"] == 4 and r["seed"] == 0
        assert set(r["versions"]) >= {"diffquant", "torch"} and r["wall_time_s"] > 0
        assert r["kind"] == {text: "perplexity", "copa": "multiple_choice", LAMBADA: "lambada"}[r["task"]]
        if r["bits"] == 16:  # the baseline belongs to no target
            assert r["target"] is None and r["granularity"] is None and r["quant"]["logits"] is None
        else:
            assert r["target"] == "attn_logits" and r["granularity"] == "sequence"
            assert r["quant"]["logits"] == {"bits": r["bits"], "granularity": "sequence", "symmetric": True,
                                            "unquantized_at_16": True}
    ppl = [r for r in records if r["kind"] == "perplexity"]
    assert all(r["metrics"]["windows"] == 4 and len(r["metrics"]["window_losses"]) == 4 for r in ppl)
    assert all(r["metrics"]["windows_total"] == 12 for r in ppl)
    assert all(r["metrics"]["n"] == 4 and len(r["metrics"]["items"]) == 4 for r in records if r["task"] == "copa")
    assert all(r["metrics"]["n"] == 4 for r in records if r["kind"] == "lambada")


def test_quantization_changes_the_scores_on_the_same_windows(full):
    _, records = full
    by = {(r["checkpoint"], r["bits"], r["task"]): r for r in records if r["kind"] == "perplexity"}
    for (ckpt, bits, task), r in by.items():
        base = by[(ckpt, 16, task)]["metrics"]
        assert r["metrics"]["window_ids"] == base["window_ids"]
        assert [w[1] for w in r["metrics"]["window_losses"]] == [w[1] for w in base["window_losses"]]
        if bits == 4:
            assert r["metrics"]["loss"] != base["loss"]


def test_records_equal_plain_evaluation(setup, full):
    """16 bits = evaluate_task / the window subset of the loaded model; 4 bits = the same on quantize(model)."""
    ckpts, text, _ = setup
    _, records = full
    for path in ckpts.values():
        model, tok = _eager(path), tokenizer_for(path)
        quantized = quantize_model(model, QuantConfig(logits=ActQuant(4, "sequence")))
        for bits, m in ((16, model), (4, quantized)):
            rec = {r["task"]: r for r in records if r["checkpoint"] == path and r["bits"] == bits}
            assert rec["copa"]["metrics"] == evaluate_task(m, tok, "copa", limit=4, seed=0, progress=False)
            lam = evaluate_task(m, tok, "lambada", limit=4, seed=0, progress=False,
                                path=FIXTURES / "lambada_small.jsonl")
            assert rec[LAMBADA]["metrics"] == lam
            assert rec[text]["metrics"] == perplexity_metrics(m, tok, documents(text), limit=4, progress=False)


def test_full_text_record_equals_text_perplexity(setup, tmp_path):
    ckpts, text, _ = setup
    path = ckpts["diff"]
    run_sweep([path], tmp_path / "r.jsonl", "attn_logits", [16], [text], progress=False)
    (rec,) = read_records(tmp_path / "r.jsonl")
    model, tok = _eager(path), tokenizer_for(path)
    docs = documents(text)
    assert rec["metrics"] == text_perplexity(model, tok, docs, progress=False)
    # a limit covering every window scores the same requests in the same batches: the same numbers
    every = perplexity_metrics(model, tok, docs, limit=100, progress=False)
    assert every["window_ids"] == list(range(12))
    assert every["loss"] == rec["metrics"]["loss"] and every["window_losses"] == rec["metrics"]["window_losses"]


# ------------------------------------------------------------------------------------------------ resume

def _killed_after(cells: int, setup, out, grid, monkeypatch) -> None:
    """A sweep to ``out`` interrupted (KeyboardInterrupt) once ``cells`` cells are scored."""
    real = sweep.evaluate_cell
    calls = []

    def dies(*args, **kwargs):
        if len(calls) == cells:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "evaluate_cell", dies)
    with pytest.raises(KeyboardInterrupt):
        _sweep(setup, out, **grid)
    monkeypatch.setattr(sweep, "evaluate_cell", real)


def test_interrupted_and_resumed_equals_uninterrupted(setup, full, tmp_path, monkeypatch):
    """Killed after 3 of 8 cells, resumed: the same records as the uninterrupted sweep (``full`` holds them)."""
    out, grid = tmp_path / "r.jsonl", dict(bits=[16, 4], tasks=[setup[1], "copa"])
    _killed_after(3, setup, out, grid, monkeypatch)
    assert len(read_records(out)) == 3
    with out.open("a") as fh:
        fh.write('{"checkpoint": "cut off in the mid')  # what a kill during a write leaves
    assert _sweep(setup, out, **grid) == {"out": str(out), "written": 5, "nonfinite": 0, "skipped": 3}
    resumed = _untimed(read_records(out))
    expected = [r for r in _untimed(full[1]) if r["bits"] in (16, 4) and r["kind"] != "lambada"]
    assert len(resumed) == 8 and sorted(resumed, key=repr) == sorted(expected, key=repr)


def test_a_gzip_records_file_resumes_like_a_plain_one(setup, full, tmp_path, monkeypatch):
    """``--out x.jsonl.gz``: one gzip member a record; killed mid-append (a cut-off member), resumed: the same
    records as the plain file, and a finished sweep compressed with gzip is complete as it stands."""
    out, grid = tmp_path / "r.jsonl.gz", dict(bits=[16, 4], tasks=["copa"])
    _killed_after(1, setup, out, grid, monkeypatch)
    with out.open("ab") as fh:
        fh.write(gzip.compress(b'{"checkpoint": "cut off"}\n')[:-5])  # a member killed before its trailer
    assert _sweep(setup, out, **grid)["written"] == 3
    expected = [r for r in _untimed(full[1]) if r["bits"] in (16, 4) and r["task"] == "copa"]
    assert sorted(_untimed(read_records(out)), key=repr) == sorted(expected, key=repr)
    whole = tmp_path / "whole.jsonl.gz"  # `gzip -n` of a finished plain sweep: one member
    whole.write_bytes(gzip.compress((setup[2] / "full.jsonl").read_bytes(), mtime=0))
    assert _sweep(setup, whole)["written"] == 0 and read_records(whole) == full[1]


def test_finished_sweep_loads_no_model(setup, full, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a finished sweep must not load models")

    monkeypatch.setattr(sweep, "load_checkpoint", no_loading)
    out = setup[2] / "full.jsonl"
    assert _sweep(setup, out)["written"] == 0


def test_a_changed_checkpoint_is_refused(setup, tmp_path):
    ckpts, text, _ = setup
    path = tmp_path / "ck"
    dq.save_checkpoint(_eager(ckpts["diff"]), path)
    out = tmp_path / "r.jsonl"
    run_sweep([path], out, "attn_logits", [16], [text], limit=2, progress=False)
    dq.save_checkpoint(randomize_(_eager(ckpts["diff"])), path, overwrite=True)
    with pytest.raises(ValueError, match="different checkpoint"):
        run_sweep([path], out, "attn_logits", [16, 4], [text], limit=2, progress=False)


def test_limit_is_the_first_items_unless_subset_random_and_records_say_which(setup, tmp_path):
    ckpts, text, _ = setup
    out = tmp_path / "r.jsonl"
    first = run_sweep([ckpts["diff"]], out, "attn_logits", [16, 4], ["copa", text], limit=3, progress=False)
    rand = run_sweep([ckpts["diff"]], out, "attn_logits", [16, 4], ["copa", text], limit=3, subset="random",
                     progress=False)
    assert first["written"] == rand["written"] == 4  # a different subset is a different cell, not a resume
    recs = read_records(out)
    by = {(r["subset"], r["task"], r["bits"]): r for r in recs}
    assert [it["id"] for it in by["first", "copa", 16]["metrics"]["items"]] == [0, 1, 2]
    assert [it["id"] for it in by["random", "copa", 16]["metrics"]["items"]] != [0, 1, 2]
    assert by["first", text, 16]["metrics"]["window_ids"] == [0, 1, 2]
    assert by["random", text, 16]["metrics"]["window_ids"] != [0, 1, 2]
    assert {(c.task, c.delta is not None) for c in degradation_rows(recs) if c.bits == 4} == {
        ("copa (first 3)", True), ("copa (random 3)", True), (f"{text} (first 3)", True),
        (f"{text} (random 3)", True)}  # each quantized record found the baseline of its own subset
    legacy = [{k: v for k, v in r.items() if k != "subset"} for r in recs if r["subset"] == "random"]
    assert [record_key(r) for r in legacy] == [record_key(r) for r in recs if r["subset"] == "random"]
    full = run_sweep([ckpts["diff"]], out, "attn_logits", [16], ["copa"], progress=False)
    assert full["written"] == 1 and read_records(out)[-1]["subset"] is None
    with pytest.raises(ValueError, match="unknown subset"):
        run_sweep([ckpts["diff"]], out, "attn_logits", [16], ["copa"], limit=3, subset="last", progress=False)


# ------------------------------------------------------------------------------------------------ targets

@pytest.mark.parametrize("target, granularity, field", [("qk", "head", "qk"), ("probs", "row", "probs"),
                                                        ("hidden", "token", "hidden"),
                                                        ("linear_inputs", None, "activations")])
def test_activation_targets(setup, tmp_path, target, granularity, field):
    ckpts, text, _ = setup
    run_sweep([ckpts["diff"]], tmp_path / "r.jsonl", target, [16, 3], [text], granularity=granularity, limit=2,
              progress=False)
    base, quant = read_records(tmp_path / "r.jsonl")
    assert quant["quant"][field] == ActQuant(3, granularity or "sequence").to_dict()
    assert quant["metrics"]["loss"] != base["metrics"]["loss"]


def test_weight_targets_share_the_baseline(setup, tmp_path):
    ckpts, text, _ = setup
    path, out = ckpts["transformer"], tmp_path / "r.jsonl"
    rtn = run_sweep([path], out, "weights-rtn", [16, 4], [text], group_size=16, limit=3, progress=False)
    gptq = run_sweep([path], out, "weights-gptq", [16, 4], [text], group_size=16, limit=3, calib_tokens=128,
                     calib_data=text, progress=False)
    assert (rtn["written"], gptq["written"], gptq["skipped"]) == (2, 1, 1)  # the 16-bit record is reused
    base, r4, g4 = read_records(out)
    assert r4["quant"]["weights"]["method"] == "rtn" and r4["group_size"] == 16 and r4["calib_tokens"] is None
    assert g4["quant"]["weights"]["method"] == "gptq" and g4["calib_tokens"] == 128 and g4["calib_data"] == text
    model, tok = _eager(path), tokenizer_for(path)
    calib = calibration_batch(tok, 32, 128, seed=0, data=text)
    assert calib.shape == (4, 32)
    qmodel = quantize_model(model, QuantConfig(weights=WeightQuant("gptq", 4, 16)), calib=calib)
    assert g4["metrics"] == perplexity_metrics(qmodel, tok, documents(text), limit=3, progress=False)
    assert len({base["metrics"]["loss"], r4["metrics"]["loss"], g4["metrics"]["loss"]}) == 3


def test_resolve_task():
    assert resolve_task("wikitext2") == sweep.Task("wikitext2", "perplexity", "wikitext2-test")
    assert resolve_task("test").source == "test" and resolve_task("tinystories").source == "tinystories-cased"
    assert resolve_task("tinyshakespeare").kind == "perplexity"
    assert resolve_task("arc-easy") == sweep.Task("arc_easy", "multiple_choice")
    assert resolve_task(LAMBADA).kind == "lambada"
    hs = resolve_task(f"hellaswag:{FIXTURES / 'hellaswag_small.jsonl'}")
    assert hs.kind == "multiple_choice" and len(load_task("hellaswag", path=hs.source)) == 4
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        resolve_task("nope")


# ------------------------------------------------------------------------------------------------ CLI

def test_cli_sweep_prints_the_table_and_a_summary(setup, tmp_path, capsys):
    ckpts, text, _ = setup
    out = tmp_path / "r.jsonl"
    argv = ["sweep", ckpts["transformer"], ckpts["diff"], "--target", "attn_logits", "--bits", "16", "4",
            "--tasks", text, "--limit", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "### attn_logits/sequence: value" in printed and "attn_logits/sequence: Diff vs Transformer" in printed
    assert json.loads(printed.strip().splitlines()[-1]) == {"out": str(out), "written": 4, "nonfinite": 0, "skipped": 0}
    assert main([*argv, "--no-table"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(out), "written": 0, "nonfinite": 0, "skipped": 4}


@pytest.mark.parametrize("change, message", [
    ({"--tasks": "nope"}, "unknown task 'nope'"),
    ({"--bits": "0"}, "bits must be 16 (unquantized) or an integer in 2..15"),
    ({"--target": "logits"}, "unknown target 'logits'"),
    ({"--target": "weights-rtn", "--bits": "12"}, "integer in 2..8 for weights-rtn"),
    ({"--group-size": "16"}, "--group-size applies to weight targets only"),
    ({"--target": "hidden", "--granularity": "head"}, "granularity 'head' applies to attention probes only"),
    ({"--granularity": "block"}, "unknown activation granularity 'block'"),
    ({"--limit": "0"}, "--limit: must be a positive integer or all"),
    ({"checkpoint": "missing"}, "does not exist"),
])
def test_cli_bad_input_is_one_line_and_exit_2(setup, tmp_path, capsys, change, message):
    ckpts, text, _ = setup
    opts = {"--target": "attn_logits", "--bits": "16", "--tasks": text, "--out": str(tmp_path / "r.jsonl")}
    opts.update({k: v for k, v in change.items() if k.startswith("--")})
    ckpt = str(tmp_path / change["checkpoint"]) if "checkpoint" in change else ckpts["diff"]
    argv = ["sweep", ckpt, *[x for kv in opts.items() for x in kv]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "r.jsonl").exists() or not read_records(tmp_path / "r.jsonl")


# ------------------------------------------------------------------------------------------------ lm-eval adapter

def test_adapter_module_imports_without_lm_eval():
    import diffquant.lmeval as adapter

    if importlib.util.find_spec("lm_eval") is None:
        with pytest.raises(ImportError, match=r"diffquant\[lmeval\]"):
            adapter.DiffquantLM  # noqa: B018


@pytest.fixture(scope="module")
def lm(setup):
    pytest.importorskip("lm_eval")
    from diffquant.lmeval import DiffquantLM

    return DiffquantLM(pretrained=setup[0]["diff"], batch_size=4)


def _instances(kind, args_list):
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, args, i) for i, args in enumerate(args_list)]


def test_adapter_loglikelihood_is_diffquants_scoring(setup, lm):
    items = load_task("copa", limit=5)
    pairs = [req for item in items for req in item.requests()]
    got = lm.loglikelihood(_instances("loglikelihood", pairs), disable_tqdm=True)
    ours = score_multiple_choice(lm.model, lm.tok, items, progress=False)
    assert [ll for ll, _ in got] == [ll for r in ours["items"] for ll in r["ll"]]


def test_adapter_without_bos_tokenises_as_lm_eval(setup, lm):
    from lm_eval.api.model import TemplateLM

    from diffquant.lmeval import DiffquantLM

    plain = DiffquantLM(pretrained=setup[0]["diff"], batch_size=4, bos="false")
    reqs = _instances("loglikelihood", [("The cat sat on the ", "mat."), ("", "Hello there"), ("A\n", "b c")])
    assert plain.loglikelihood(reqs, disable_tqdm=True) == TemplateLM.loglikelihood(plain, reqs, disable_tqdm=True)
    assert plain.loglikelihood(reqs, disable_tqdm=True) != lm.loglikelihood(reqs, disable_tqdm=True)


def test_adapter_rolling_loglikelihood_is_text_perplexity(setup, lm):
    texts = [documents(setup[1])[0].text, "A short one.", ""]
    got = lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(t,) for t in texts]), disable_tqdm=True)
    for text, ll in zip(texts[:2], got[:2], strict=True):
        ref = text_perplexity(lm.model, lm.tok, text, progress=False)
        assert ll == pytest.approx(-ref["loss"] * ref["tokens"], rel=1e-12)
    assert got[2] == 0.0


def test_adapter_generates_greedily_until_a_stop_string(lm):
    (free,) = lm.generate_until(_instances("generate_until", [("Once upon a time", {"max_gen_toks": 12})]))
    assert isinstance(free, str) and free
    stop = free.strip()[:3]
    (cut,) = lm.generate_until(_instances("generate_until", [("Once upon a time", {"until": [stop],
                                                                                     "max_gen_toks": 12})]))
    assert stop not in cut and free.startswith(cut)
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until(_instances("generate_until", [("x", {"do_sample": True})]))


def test_adapter_quantizes(setup, lm):
    from diffquant.evaluate import encode_pair, score_requests
    from diffquant.lmeval import DiffquantLM

    q = DiffquantLM(pretrained=setup[0]["diff"], quant='{"logits": {"bits": 4}}', batch_size=4)
    reqs = _instances("loglikelihood", [("The cat sat on the", " mat.")])
    qmodel = quantize_model(lm.model, QuantConfig(logits=ActQuant(4)))
    scores = score_requests(qmodel, [encode_pair(lm.tok, "The cat sat on the", " mat.")], progress=False)
    assert q.loglikelihood(reqs, disable_tqdm=True) == [(s["ll"], s["greedy"]) for s in scores]
    assert q.loglikelihood(reqs, disable_tqdm=True) != lm.loglikelihood(reqs, disable_tqdm=True)


@pytest.mark.slow
def test_adapter_runs_an_lm_eval_task_with_local_data(setup, lm, tmp_path, monkeypatch):
    """lm-eval's own pipeline (task YAML, local jsonl) on the adapter gives diffquant's COPA accuracy."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = _local_copa_task(tmp_path)
    result = lm_eval.simple_evaluate(model=lm, tasks=["dq_copa_local"],
                                     task_manager=TaskManager(include_path=str(tmp_path)))
    got = result["results"]["dq_copa_local"]
    ours = score_multiple_choice(lm.model, lm.tok, items, progress=False)
    assert got["acc,none"] == pytest.approx(ours["acc"]) and got["acc_norm,none"] == pytest.approx(ours["acc_norm"])


def _local_copa_task(folder: Path, n: int = 10) -> list:
    """An lm-eval task ``dq_copa_local`` (YAML + local jsonl in ``folder``) of COPA's first ``n`` items."""
    items = load_task("copa", limit=n)
    data = folder / "copa.jsonl"
    data.write_text("".join(json.dumps({"query": it.contexts[0], "choices": list(it.choices), "gold": it.gold}) + "\n"
                            for it in items))
    (folder / "copa_local.yaml").write_text(
        f"task: dq_copa_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    return items


def test_lm_eval_wrapper_without_lm_eval_is_one_line_and_exit_2(monkeypatch, capsys):
    import diffquant.lmeval as adapter

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    monkeypatch.setattr(adapter, "_CLASS", None)
    assert adapter.main(["--model", "diffquant", "--tasks", "copa"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'diffquant[lmeval]'" in err


def _run_python(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_lm_eval_registry_keeps_its_own_models_after_register(tmp_path):
    """lm-eval fills its registry only while it is empty: registering first must not hide ``hf`` and the rest."""
    pytest.importorskip("lm_eval")
    code = ("from diffquant.lmeval import register, lm_class; register()\n"
            "from lm_eval.api.registry import get_model, MODEL_REGISTRY\n"
            "assert get_model('diffquant') is lm_class() and 'hf' in MODEL_REGISTRY and 'dummy' in MODEL_REGISTRY\n")
    done = _run_python(["-c", code], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_python_m_diffquant_lmeval_is_lm_evals_cli_with_the_model_registered(setup, tmp_path):
    """``python -m diffquant.lmeval --model diffquant ...`` runs lm-eval's CLI end to end: diffquant's COPA scores."""
    pytest.importorskip("lm_eval")
    items = _local_copa_task(tmp_path)
    done = _run_python(["-m", "diffquant.lmeval", "--model", "diffquant", "--model_args",
                        f"pretrained={setup[0]['diff']}", "--batch_size", "4", "--tasks", "dq_copa_local",
                        "--include_path", str(tmp_path), "--output_path", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (found,) = (tmp_path / "out").rglob("results_*.json")
    got = json.loads(found.read_text())["results"]["dq_copa_local"]
    model, tok = _eager(setup[0]["diff"]), tokenizer_for(setup[0]["diff"])
    ours = score_multiple_choice(model, tok, items, progress=False)
    assert got["acc,none"] == pytest.approx(ours["acc"]) and got["acc_norm,none"] == pytest.approx(ours["acc_norm"])
