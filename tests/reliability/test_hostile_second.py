"""The second adversarial pass (issue 42), table-driven like test_hostile_cli.py: every hostile input ends with
exit 2, one line on stderr naming the problem (never a bare errno), every input byte-identical and every special
file still what it was. Then the cases whose right answer is not a refusal: restarts after a kill before the
first save, a 250-character output name, sweep resume by resolved path, and the memory estimates.

``CASES`` maps an id to ``(setup, argv, words)``; ``setup(w, t)`` gets lazily made private copies ``w`` of the
assets (checkpoint, text, records; token corpora ``corpus`` and ``corpus_b``; a 2-step training ``run`` on
``corpus`` with a branch at step 1) and a scratch folder ``t``, and returns extra paths by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from diffquant.checkpoint.gguf import stories260k_path
from diffquant.cli import main

from . import hostile as h
from . import hostile2 as h2
from .conftest import fingerprint, run_cli

TRAIN = ["train", "--arch", "diff", "--preset", "xs", "--tokens", "128", "--batch-size", "2", "--seq-len", "32",
         "--eval-tokens", "64"]
RESUME = [*TRAIN, "--data", "{corpus}", "--out", "{run}", "--resume"]
SWEEP = ["sweep", "{ckpt}", "--target", "weights-rtn", "--bits", "16", "--tasks", "{text}", "--limit", "2"]


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("second")
    a, b = h2.corpus(root / "corpus"), h2.corpus(root / "corpus_b", seed=1)
    assert main([*TRAIN, "--data", str(a), "--branch-every", "1", "--out", str(root / "run")]) == 0
    return {"corpus": a, "corpus_b": b, "run": root / "run"}


class Copies(dict):
    """Private copies of the module's assets, made when a case first names one."""

    def __init__(self, work: dict, assets: dict, root: Path):
        super().__init__(work)
        self.assets, self.root = assets, root

    def __missing__(self, key):
        if key not in self.assets:
            raise KeyError(key)
        self[key] = shutil.copytree(self.assets[key], self.root / key)
        return self[key]


@pytest.fixture
def w(work, second, tmp_path) -> Copies:
    return Copies(work, second, tmp_path / "copies")


def nothing(w, t):
    return {}


def packed(w, t, bits: int = 4):
    assert main(["quantize", str(w["ckpt"]), "--weights", "rtn", "--bits", str(bits), "--out", str(t / "q")]) == 0
    return {"q": t / "q"}


def packed_with(tamper):
    def setup(w, t):
        q = packed(w, t)["q"]
        tamper(q)
        return {"q": q}

    return setup


def model_copy(w, t):
    v = t / "v.gguf"
    shutil.copyfile(w["ckpt"] / "model.safetensors", v)
    return {"v": v}


def text_file(content: str):
    def setup(w, t):
        (t / "notes.txt").write_text(content)
        return {"v": t / "notes.txt"}

    return setup


def manifest(shard=None, **changes):
    return lambda w, t: h2.manifest_edit(w["corpus"], shard, **changes) and {}


def trainer(**kwargs):
    return lambda w, t: h2.trainer_edit(w["run"] / "state", **kwargs) and {}


def native(tie=False, drop=None, **config):
    return lambda w, t: {"hf": h2.hf_weights_edit(h2.native_hf(t / "hf", tie=tie), drop=drop, **config)}


def quantized_run(w, t):
    q = t / "q"
    assert main(["quantize", str(w["run"] / "final"), "--weights", "rtn", "--bits", "4", "--out", str(q)]) == 0
    return {"q": q}


LM_HEAD = "lm_head.weight"
MOD = "layers.0.attn.q_proj"  # a quantized Linear of the tiny checkpoint (in 32)
_MANIFEST_TRAIN = [*TRAIN, "--data", "{corpus}", "--out", "{t}/r"]

CASES = {
    # -- 1. data loss: validate before touching; never replace what is not a regular file or our folder --------
    "sweep/out-is-a-model-file": (model_copy, [*SWEEP, "--out", "{v}"], "records file"),
    "sweep/out-is-one-line-of-text": (text_file("a note without a newline"), [*SWEEP, "--out", "{v}"],
                                      "records file"),
    "sweep/out-is-text": (text_file("line one\nline two\nlast line"), [*SWEEP, "--out", "{v}"], "records file"),
    "sweep/out-is-a-fifo": (lambda w, t: {"f": h2.fifo(t / "f")}, [*SWEEP, "--out", "{f}"], "is a FIFO"),
    "report/output-fifo": (lambda w, t: {"f": h2.fifo(t / "f")}, ["report", "{records}", "--output", "{f}"],
                           "is a FIFO"),
    "report/output-device-node": (lambda w, t: {"n": h2.char_device(t / "mynull")},
                                  ["report", "{records}", "--output", "{n}"], "is a character device"),
    "report/plot-fifo": (lambda w, t: {"f": h2.fifo(t / "f.png")}, ["report", "{records}", "--plot", "{f}"],
                         "is a FIFO"),
    "profile/json-fifo": (lambda w, t: {"f": h2.fifo(t / "f")}, ["profile", "{ckpt}", "--json", "{f}"],
                          "is a FIFO"),
    "quantize/out-fifo": (lambda w, t: {"f": h2.fifo(t / "f")},
                          ["quantize", "{ckpt}", "--weights", "rtn", "--bits", "4", "--out", "{f}"], "is a FIFO"),
    "convert/out-device-node": (lambda w, t: {"n": h2.char_device(t / "n")},
                                ["convert", "{ckpt}", "{n}", "--to", "hf"], "is a character device"),
    "train/out-fifo": (lambda w, t: {"f": h2.fifo(t / "f")}, [*TRAIN, "--data", "{corpus}", "--out", "{f}"],
                       "is a FIFO"),
    "sample/out-fifo": (lambda w, t: {"f": h2.fifo(t / "f"), "g": stories260k_path()},
                        ["sample", "{g}", "--tokens", "10", "--out", "{f}"], "is a FIFO"),
    "report/output-under-a-file": (nothing, ["report", "{records}", "--output", "{text}/table.md"],
                                   "not a directory"),
    # -- 2. security: shard names are the sampler's, never paths --------------------------------------------
    "train/manifest-shard-parent": (manifest({"file": "../x.bin"}), _MANIFEST_TRAIN, "file must be 'shard_00000.bin'"),
    "train/manifest-shard-absolute": (manifest({"file": "/etc/hostname"}), _MANIFEST_TRAIN, "file must be"),
    "sample/resume-shard-outside": (lambda w, t: h2.manifest_edit(w["corpus"], {"file": "../x.bin"}) and
                                    {"g": stories260k_path()},
                                    ["sample", "{g}", "--tokens", "10", "--out", "{corpus}"], "file must be"),
    # -- 3. silent wrong results ---------------------------------------------------------------------------
    "train/manifest-dtype-float32": (manifest(dtype="float32"), _MANIFEST_TRAIN, "dtype must be 'uint16'"),
    "train/manifest-dtype-V3": (manifest(dtype="V3"), _MANIFEST_TRAIN, "dtype must be 'uint16'"),
    "train/manifest-odd-bytes": (lambda w, t: h.truncate(w["corpus"] / "shard_00000.bin", 7999 / 8000) and {},
                                 _MANIFEST_TRAIN, "holds 7999 bytes"),
    "train/manifest-token-count": (manifest({"tokens": 3999}), _MANIFEST_TRAIN, "the manifest says 3999"),
    "train/manifest-shard-twice": (lambda w, t: h2.manifest_edit(
        w["corpus"], shards=2 * json.loads((w["corpus"] / "manifest.json").read_text())["shards"]) and {},
        _MANIFEST_TRAIN, "shard 1: file must be 'shard_00001.bin'"),
    "train/manifest-bos-outside": (manifest(bos_id=512), _MANIFEST_TRAIN, "bos_id must be an integer in 0..511"),
    "info/packed-code-out-of-range": (packed_with(lambda q: h2.packed_tamper(q, MOD, "qweight", (0, 0), 0xFF)),
                                      ["info", "{q}"], "codes outside the 4-bit range"),
    "convert/packed-code-out-of-range": (packed_with(lambda q: h2.packed_tamper(q, MOD, "qweight", (0, 0), 0xFF)),
                                         ["convert", "{q}", "{t}/hf", "--to", "hf"], "codes outside"),
    "info/packed-scale-negative": (packed_with(lambda q: h2.packed_tamper(q, MOD, "scale", (0, 0), -1.0)),
                                   ["info", "{q}"], "scales must be finite and non-negative"),
    "info/packed-scale-zero-over-codes": (packed_with(lambda q: h2.packed_tamper(q, MOD, "scale", (0, 0), 0.0)),
                                          ["info", "{q}"], "a zero scale over codes that are not zero"),
    "info/hf-untied-without-head": (native(drop=LM_HEAD), ["profile", "{hf}", "--tokens", "64"], "lm_head.weight"),
    "info/hf-tied-but-other-head": (native(tie=False, tie_word_embeddings=True),
                                    ["profile", "{hf}", "--tokens", "64"], "stored lm_head.weight differs"),
    "train/init-from-other-arch": (nothing, ["train", "--arch", "transformer", *TRAIN[3:], "--data", "{corpus}",
                                             "--init-from", "{run}/final", "--out", "{t}/r"],
                                   "different model than the one requested"),
    "train/init-from-packed": (quantized_run, [*TRAIN, "--data", "{corpus}", "--init-from", "{q}", "--out",
                                               "{t}/r"], "packed quantized checkpoint"),
    "train/resume-step-negative": (trainer(step=-5), RESUME, "step -5 is not a step of this run"),
    "train/resume-step-huge": (trainer(step=10**12), RESUME, "is not a step of this run"),
    "train/resume-step-edited": (trainer(step=1), RESUME, "step 1 is not a step of this run"),
    "train/resume-without-config": (trainer(drop="train_config"), RESUME, "train_config is missing"),
    "train/resume-other-corpus": (nothing, [*TRAIN, "--data", "{corpus_b}", "--out", "{run}", "--resume"],
                                  "trained on other train tokens"),
    "train/resume-other-corpus-log-edited": (lambda w, t: h2.log_tokens_of(w["run"], w["corpus_b"]) and {},
                                             [*TRAIN, "--data", "{corpus_b}", "--out", "{run}", "--resume"],
                                             "trained on other train tokens"),
    "train/branch-other-corpus": (nothing, [*TRAIN, "--data", "{corpus_b}", "--branch-from",
                                            "{run}/branches/step000001", "--out", "{t}/b"],
                                  "trained on other train tokens"),
    "report/bits-negative": (lambda w, t: h.records_with(w["records"], bits=-4) and {}, ["report", "{records}"],
                             "bits must lie in 1..32"),
    "report/bits-huge": (lambda w, t: h.records_with(w["records"], bits=10**30) and {}, ["report", "{records}"],
                         "bits must lie in 1..32"),
    "report/perplexity-negative": (lambda w, t: h.records_with(
        w["records"], metrics={"perplexity": -5.0, "loss": 1.0, "window_losses": [[1.0, 4]]}) and {},
        ["report", "{records}"], "perplexity must be positive"),
    "report/window-of-0-tokens": (lambda w, t: h.records_with(
        w["records"], metrics={"perplexity": 2.0, "loss": 1.0, "window_losses": [[1.0, 0]]}) and {},
        ["report", "{records}"], "tokens a positive integer"),
    # -- 6. tracebacks before: one line now ------------------------------------------------------------------
    "info/packed-group-size-0": (packed_with(lambda q: h2.quant_json_edit(q, MOD, group_size=0)), ["info", "{q}"],
                                 "group_size must be null or a positive integer"),
    "info/packed-group-size-negative": (packed_with(lambda q: h2.quant_json_edit(q, MOD, group_size=-32)),
                                        ["info", "{q}"], "group_size must be null or a positive integer"),
    "info/packed-in-features-1e9": (packed_with(lambda q: h2.quant_json_edit(q, MOD, in_features=10**9)),
                                    ["info", "{q}"], "in_features must be 32"),
    "info/packed-bits-string": (packed_with(lambda q: h2.quant_json_edit(q, MOD, bits="4")), ["info", "{q}"],
                                "bits must be an integer in 2..8"),
    "train/manifest-vocab-string": (manifest(vocab_size="512"), _MANIFEST_TRAIN, "vocab_size must be an integer"),
    "train/manifest-shards-object": (manifest(shards={"file": "shard_00000.bin"}), _MANIFEST_TRAIN,
                                     "shards must be a list"),
    "train/resume-trainer-json-corrupt": (trainer(text="{not json"), RESUME, "not valid JSON"),
    "train/resume-optimizer-corrupt": (lambda w, t: h.truncate(w["run"] / "state" / "optimizer.safetensors") and {},
                                       RESUME, "corrupt or truncated"),
    "info/hf-vocab-not-the-weights": (native(vocab_size=4096), ["profile", "{hf}", "--tokens", "64"],
                                      "config does not match the weights"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_line_and_exit_2(case, w, tmp_path, capsys):
    setup, argv, words = CASES[case]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    names = w
    names.update(setup(w, scratch) or {}, t=scratch)
    args = [a.format_map(names) for a in argv]
    paths = [p for p in names.values() if os.path.lexists(p)]
    before, types = fingerprint(*[p for p in paths if p.is_file() or p.is_dir()]), h2.node_types(*paths)
    code, _, err = run_cli(args, capsys)
    assert code == 2, err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1, err
    assert words in err, err
    assert "Traceback" not in err and "[Errno" not in err, err
    after = fingerprint(*[p for p in paths if p.is_file() or p.is_dir()])
    assert {k: v for k, v in after.items() if k in before} == before  # no input changed
    assert {k: v for k, v in h2.node_types(*paths).items() if k in types} == types  # no node replaced


def test_manifest_negative_ids_are_refused(tmp_path):
    from diffquant.corpus import CorpusError, load_corpus

    folder = h2.negative_ids(tmp_path / "c")
    before = fingerprint(folder)
    with pytest.raises(CorpusError, match="token ids outside 0..69999"):
        load_corpus(folder)
    assert fingerprint(folder) == before


def test_a_diverged_run_keeps_standard_json_and_no_inf_checkpoint(second, tmp_path, capsys):
    out = tmp_path / "r"
    code, _, err = run_cli([*TRAIN, "--tokens", "64", "--lr", "1000000", "--warmup-steps", "0", "--data",
                            second["corpus"], "--out", out], capsys)
    assert code == 2 and ("NaN or Inf" in err or "diverged" in err), err
    if (out / "train_log.json").exists():
        json.loads((out / "train_log.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the log"))
    assert not (out / "final").exists()


def test_non_finite_weights_are_refused_at_save(tmp_path):
    import torch

    from diffquant import build_model, save_checkpoint
    from diffquant.errors import UserError

    from .conftest import tiny_config

    model = build_model(tiny_config())
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight[0, 0] = 70000.0  # finite in float32, Inf in float16
    save_checkpoint(model, tmp_path / "f32")
    with pytest.raises(UserError, match="overflow float16"):
        save_checkpoint(model, tmp_path / "f16", dtype=torch.float16)
    assert not (tmp_path / "f16").exists()


def test_train_killed_before_its_first_save_starts_over(second, tmp_path, capsys):
    out = tmp_path / "r"
    (out / "snapshots" / "step000001").mkdir(parents=True)  # what a SIGKILL after the first snapshot leaves
    code, _, err = run_cli([*TRAIN, "--data", second["corpus"], "--out", out], capsys)
    assert code == 0, err
    assert json.loads((out / "state" / "trainer.json").read_text())["step"] == 2
    code, _, err = run_cli([*TRAIN, "--data", second["corpus"], "--out", out], capsys)  # now it holds a run
    assert code == 2 and "add --resume" in err and "resume=True" not in err


def test_sample_killed_before_its_first_manifest_resumes(tmp_path, capsys):
    out = tmp_path / "c"
    out.mkdir()
    shutil.copyfile(h2.stories260k_tokenizer_path(), out / "tokenizer.model")  # copied before the first shard
    argv = ["sample", stories260k_path(), "--tokens", "40", "--batch-size", "2", "--max-len", "16",
            "--shard-tokens", "40", "--out", out]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert json.loads((out / "manifest.json").read_text())["shards"][0]["file"] == "shard_00000.bin"


def test_a_250_character_output_name_works(assets, tmp_path, capsys):
    out = tmp_path / ("t" * 247 + ".md")
    code, _, err = run_cli(["report", assets["records"], "--output", out, "--n-boot", "10"], capsys)
    assert code == 0, err
    assert out.read_text().strip() and not [p for p in tmp_path.iterdir() if p != out]


def test_sweep_resume_matches_checkpoints_by_resolved_path(assets, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(assets["ckpt"].parent)
    link = tmp_path / "link"
    link.symlink_to(assets["ckpt"])
    out = tmp_path / "r.jsonl"
    for ckpt in (assets["ckpt"].name, str(assets["ckpt"]), str(link)):
        code, _, err = run_cli(["sweep", ckpt, "--target", "weights-rtn", "--bits", "16", "--tasks",
                                assets["text"], "--limit", "2", "--out", out], capsys)
        assert code == 0, err
    assert len(out.read_text().splitlines()) == 1


@pytest.mark.parametrize("argv, words", [
    (["sample", "{g}", "--batch-size", "4096", "--max-len", "512", "--tokens", "10", "--out", "{t}/c"],
     "sampling 4096 stories of up to 512 tokens at once (a float64 KV cache) needs at least"),
    (["sweep", "{ckpt}", "--target", "weights-rtn", "--bits", "16", "--tasks", "wikitext2", "--batch-size", "4096",
      "--limit", "all", "--out", "{t}/r.jsonl"], "scoring 4096 windows of 64 tokens at once"),
    (["train", "--arch", "diff", "--preset", "xs", "--tokens", "2097152", "--batch-size", "4096", "--seq-len",
      "512", "--data", "{corpus}", "--out", "{t}/r"], "a training step of 4096 x 512 tokens needs at least"),
])
def test_memory_is_estimated_before_allocation(argv, words, assets, second, tmp_path, monkeypatch, capsys):
    import diffquant.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 1 << 30)  # a 1 GiB machine
    names = {**assets, **second, "g": stories260k_path(), "t": tmp_path}
    code, _, err = run_cli([a.format_map(names) for a in argv], capsys)
    assert code == 2 and words in err and "but only 1.0 GiB is free" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "c").exists() and not (tmp_path / "r").exists()


def test_train_state_checks(second, tmp_path):
    """Moments of other shapes than the model's parameters are refused in one line (not at the first step)."""
    import torch

    from diffquant import train as tr

    model, moments, *_ = tr.load_state_dir(second["run"] / "state", "cpu")
    opt = tr.make_optimizer(model, tr.TrainConfig(tokens=128, batch_size=2, seq_len=32))
    moments = {k: (v[:1] if k == "0.exp_avg" else v) for k, v in moments.items()}
    with pytest.raises(ValueError, match=r"does not match the model \(parameter 0\)"):
        tr.restore_optimizer(opt, moments)
    assert isinstance(moments["0.step"], torch.Tensor)


def test_check_output_refuses_special_files_for_every_writer(tmp_path):
    from diffquant.errors import UserError
    from diffquant.io import atomic_dir, atomic_write_text, locked_append

    f = h2.fifo(tmp_path / "f")
    for write in (lambda: atomic_write_text(f, "x"), lambda: atomic_dir(f).__enter__(),
                  lambda: locked_append(f).__enter__()):
        with pytest.raises(UserError, match="is a FIFO"):
            write()
    assert stat.S_ISFIFO(os.lstat(f).st_mode)


def test_scratch_names_of_long_targets_stay_legal_and_are_cleaned(tmp_path):
    from diffquant.io import TMP_TAG, clean_stale, scratch_name

    target = tmp_path / ("é" * 125)  # 250 bytes
    tmp = scratch_name(target, TMP_TAG, ".json", pid=2**22 + 1)  # a dead writer's
    assert len(tmp.name.encode()) <= 255
    tmp.write_text("left over")
    clean_stale(target)
    assert not tmp.exists()


def test_errno_lines_name_the_path():
    from diffquant.errors import first_line

    assert first_line(PermissionError(13, "Permission denied", "/x/y")) == "/x/y: permission denied"
    assert first_line(FileNotFoundError("custom message")) == "custom message"
    assert re.match(r"^a -> b: ", first_line(OSError(18, "Invalid cross-device link", "a", None, "b")))


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_kv_cache_estimate_is_the_cache_allocated(arch):
    import torch

    from diffquant import ModelConfig
    from diffquant.memory import kv_cache_bytes
    from diffquant.model import KVCache

    cfg = ModelConfig.preset("xs", arch=arch)
    cache = KVCache(cfg, 3, 40, dtype=torch.float64)
    allocated = sum(t.nbytes for t in cache.keys + cache.values)
    assert kv_cache_bytes(cfg, 3, 40, 8) == allocated


def test_cgroup_page_cache_counts_as_free(tmp_path, monkeypatch):
    import diffquant.memory as memory

    files = {"memory.max": "1000000", "memory.current": "900000", "memory.stat": "anon 100000\ninactive_file 800000\n"}
    real = memory.Path

    def fake(p):
        name = str(p).rsplit("/", 1)[-1]
        return tmp_path / name if str(p).startswith("/sys/fs/cgroup/") else real(p)

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(memory, "Path", fake)
    assert memory._cgroup_free() == 1000000 - (900000 - 800000)
