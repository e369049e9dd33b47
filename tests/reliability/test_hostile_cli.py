"""Table-driven hostile inputs, per sub-command, through ``diffquant.cli.main`` in-process.

Every case must end with exit code 2, exactly one line on stderr (``diffquant: error: ...``) naming the
problem, and every input file untouched. ``CASES`` maps a case id to ``(setup, argv, words)``: ``setup(w, t)``
prepares hostile files from the private asset copies ``w`` in the scratch folder ``t`` and returns extra
paths by name; ``argv`` is formatted with ``w`` and those paths.
"""

from __future__ import annotations

import re

import pytest

from . import hostile as h
from .conftest import fingerprint, run_cli


def nothing(w, t):
    return {}


def hf(w, t):
    return {"hf": h.hf_folder(w["ckpt"], t / "hf")}


def packed(w, t):
    from diffquant.cli import main

    assert main(["quantize", str(w["ckpt"]), "--weights", "rtn", "--bits", "4", "--out", str(t / "q")]) == 0
    return {"q": t / "q"}


def packed_bits_edited(w, t):
    q = packed(w, t)["q"]
    qfile = q / "quant.json"
    qfile.write_text(qfile.read_text().replace('"bits": 4', '"bits": 3', 1))
    return {"q": q}


def _text(path):
    path.write_text("Once upon a time there was a story in a file with an odd name.\n" * 20)
    return path


def corrupt_tokenizer(w, t):
    (t / "tok.json").write_text('{"model": {"type": "BPE", "vocab": 17}}')
    return {"tok": t / "tok.json"}


CASES = {
    # -- info: loading checks before anything is allocated ------------------------------------------------
    "info/missing": (nothing, ["info", "{t}/nope"], "does not exist"),
    "info/pickle-file": (lambda w, t: {"p": h.junk(t / "weights.bin")}, ["info", "{p}"], "pickle"),
    "info/hf-pickle-only": (lambda w, t: {"hf": h.pickle_only(hf(w, t)["hf"])}, ["info", "{hf}"], "pickle"),
    "info/empty-config": (lambda w, t: h.edit_config(w["ckpt"], "") and {}, ["info", "{ckpt}"], "not valid JSON"),
    "info/config-is-a-path": (lambda w, t: h.edit_config(w["ckpt"], '"/etc/passwd"') and {}, ["info", "{ckpt}"],
                              "must be a JSON object"),
    "info/config-list": (lambda w, t: h.edit_config(w["ckpt"], "[1, 2]") and {}, ["info", "{ckpt}"],
                         "must be a JSON object"),
    "info/tie-embeddings-string": (lambda w, t: h.edit_config(w["ckpt"], tie_embeddings="no") and {},
                                   ["info", "{ckpt}"], "tie_embeddings must be bool"),
    "info/layers-bool": (lambda w, t: h.edit_config(w["ckpt"], n_layers=True) and {}, ["info", "{ckpt}"],
                         "n_layers must be int"),
    "info/rope-theta-nan": (lambda w, t: h.edit_config(w["ckpt"], '{"rope_theta": NaN}') and {},
                            ["info", "{ckpt}"], "non-standard constant NaN"),
    "info/norm-eps-infinity": (lambda w, t: h.edit_config(w["ckpt"], '{"norm_eps": Infinity}') and {},
                               ["info", "{ckpt}"], "non-standard constant Infinity"),
    "info/norm-eps-negative": (lambda w, t: h.edit_config(w["ckpt"], norm_eps=-1.0) and {}, ["info", "{ckpt}"],
                               "must be positive"),
    "info/million-layers": (lambda w, t: h.edit_config(w["ckpt"], n_layers=1_000_000) and {}, ["info", "{ckpt}"],
                            "n_layers must be a positive integer (at most 1024)"),
    "info/huge-vocab": (lambda w, t: h.edit_config(w["ckpt"], vocab_size=10**9) and {}, ["info", "{ckpt}"],
                        "vocab_size must be a positive integer"),
    "info/config-vs-shapes": (lambda w, t: h.edit_config(w["ckpt"], vocab_size=1 << 20, d_model=4096) and {},
                              ["info", "{ckpt}"], "config does not match the weights"),
    "info/unknown-field": (lambda w, t: h.edit_config(w["ckpt"], evil=1) and {}, ["info", "{ckpt}"],
                           "unknown config fields: evil"),
    "info/header-bomb": (lambda w, t: h.header_bomb(w["ckpt"] / "model.safetensors") and {}, ["info", "{ckpt}"],
                         "more than the file holds"),
    "info/header-length-bomb": (lambda w, t: (w["ckpt"] / "model.safetensors").write_bytes(b"\xff" * 8) and {},
                                ["info", "{ckpt}"], "corrupt or truncated"),
    "info/truncated": (lambda w, t: h.truncate(w["ckpt"] / "model.safetensors") and {}, ["info", "{ckpt}"],
                       "corrupt or truncated"),
    "info/int8-weights": (lambda w, t: h.int8_weights(w["ckpt"]) and {}, ["info", "{ckpt}"],
                          "expected a float type"),
    "info/hf-shard-outside": (lambda w, t: {"hf": h.shard_outside(hf(w, t)["hf"])}, ["info", "{hf}"],
                              "not a .safetensors file inside"),
    "info/hf-million-layers": (lambda w, t: {"hf": h.hf_config_edit(hf(w, t)["hf"], num_hidden_layers=10**6)},
                               ["info", "{hf}"], "n_layers must be a positive integer"),
    "info/hf-config-vs-shapes": (lambda w, t: {"hf": h.hf_config_edit(hf(w, t)["hf"], vocab_size=4096)},
                                 ["info", "{hf}"], "config does not match the weights"),
    "info/gguf-zero-heads": (lambda w, t: {"g": h.gguf_zero_heads(t / "z.gguf")}, ["info", "{g}"],
                             "head_count must be positive"),
    "info/gguf-junk": (lambda w, t: {"g": h.junk(t / "j.gguf")}, ["info", "{g}"], "not a GGUF file"),
    "info/packed-bits-edited": (packed_bits_edited, ["info", "{q}"], "changed after the weights were written"),
    # -- profile: numbers, paths, data, tokenizers ---------------------------------------------------------
    "profile/tokens-0": (nothing, ["profile", "{ckpt}", "--tokens", "0"], "--tokens: must be an integer in 1.."),
    "profile/tokens-negative": (nothing, ["profile", "{ckpt}", "--tokens", "-1"], "--tokens: must be an integer"),
    "profile/tokens-text": (nothing, ["profile", "{ckpt}", "--tokens", "many"], "expected an integer"),
    "profile/seq-len-0": (nothing, ["profile", "{ckpt}", "--seq-len", "0"], "--seq-len: must be"),
    "profile/seq-len-negative": (nothing, ["profile", "{ckpt}", "--seq-len", "-5"], "--seq-len: must be"),
    "profile/seq-len-too-long": (nothing, ["profile", "{ckpt}", "--data", "{text}", "--seq-len", "100000"],
                                 "exceeds"),
    "profile/chunk-0": (nothing, ["profile", "{ckpt}", "--chunk", "0"], "--chunk: must be"),
    "profile/batch-size-0": (nothing, ["profile", "{ckpt}", "--batch-size", "0"], "--batch-size: must be"),
    "profile/topk-0": (nothing, ["profile", "{ckpt}", "--topk", "0"], "--topk: must be"),
    "profile/json-is-weights": (nothing, ["profile", "{ckpt}", "--json", "{ckpt}/model.safetensors"],
                                "lies inside the input"),
    "profile/json-is-checkpoint": (nothing, ["profile", "{ckpt}", "--json", "{ckpt}"], "is the input"),
    "profile/json-around-checkpoint": (nothing, ["profile", "{ckpt}", "--json", "{t}/.."], "contains the input"),
    "profile/json-is-data": (nothing, ["profile", "{ckpt}", "--data", "{text}", "--json", "{text}"],
                             "is the input data"),
    "profile/plot-inside": (nothing, ["profile", "{ckpt}", "--plot", "{ckpt}/p.png"], "lies inside"),
    "profile/hist-plot-is-data": (lambda w, t: {"ph": _text(t / "p-hist.png")},
                                  ["profile", "{ckpt}", "--data", "{ph}", "--plot", "{t}/p.png"], "is the input"),
    "profile/training-plot-is-tokenizer": (corrupt_tokenizer, ["profile", "{ckpt}", "--tokenizer", "{tok}",
                                                               "--training-plot", "{tok}"], "is the input"),
    "profile/binary-data": (lambda w, t: {"bin": h.junk(t / "junk.txt")}, ["profile", "{ckpt}", "--data", "{bin}"],
                            "not a text file"),
    "profile/corrupt-xz": (lambda w, t: {"xz": h.junk(t / "junk.txt.xz")}, ["profile", "{ckpt}", "--data", "{xz}"],
                           "corrupt or truncated"),
    "profile/missing-data": (nothing, ["profile", "{ckpt}", "--data", "{t}/none.txt"], "no such corpus"),
    "profile/corrupt-tokenizer": (corrupt_tokenizer, ["profile", "{ckpt}", "--data", "{text}", "--tokenizer",
                                                      "{tok}"], "corrupt or not a tokenizer"),
    "profile/hf-pickle-only": (lambda w, t: {"hf": h.pickle_only(hf(w, t)["hf"])}, ["profile", "{hf}"], "pickle"),
    "profile/hf-shard-outside": (lambda w, t: {"hf": h.shard_outside(hf(w, t)["hf"])}, ["profile", "{hf}"],
                                 "inside"),
    "profile/same-label": (nothing, ["profile", "{ckpt}", "{ckpt}/."], "same label"),
    # -- quantize ------------------------------------------------------------------------------------------
    "quantize/out-is-source": (nothing, ["quantize", "{ckpt}", "--weights", "rtn", "--bits", "4", "--out",
                                         "{ckpt}", "--overwrite"], "is the input"),
    "quantize/out-inside-source": (nothing, ["quantize", "{ckpt}", "--weights", "rtn", "--bits", "4", "--out",
                                             "{ckpt}/q"], "lies inside"),
    "quantize/out-around-source": (nothing, ["quantize", "{ckpt}", "--weights", "rtn", "--bits", "4", "--out",
                                             "{t}/..", "--overwrite"], "contains"),
    "quantize/threshold-nan": (nothing, ["quantize", "{ckpt}", "--weights", "bnb-int8", "--threshold", "nan",
                                         "--out", "{t}/q"], "--threshold: must be a finite"),
    "quantize/damp-inf": (nothing, ["quantize", "{ckpt}", "--weights", "gptq", "--bits", "4", "--damp", "inf",
                                    "--out", "{t}/q"], "--damp: must be a finite"),
    "quantize/damp-negative": (nothing, ["quantize", "{ckpt}", "--damp", "-1", "--out", "{t}/q"], "--damp"),
    "quantize/calib-seq-len-0": (nothing, ["quantize", "{ckpt}", "--calib-seq-len", "0", "--out", "{t}/q"],
                                 "--calib-seq-len: must be"),
    "quantize/calib-tokens-0": (nothing, ["quantize", "{ckpt}", "--calib-tokens", "0", "--out", "{t}/q"],
                                "--calib-tokens: must be"),
    "quantize/group-size-0": (nothing, ["quantize", "{ckpt}", "--group-size", "0", "--out", "{t}/q"],
                              "--group-size: must be"),
    "quantize/seed-negative": (nothing, ["quantize", "{ckpt}", "--seed", "-1", "--out", "{t}/q"], "--seed"),
    "quantize/bits-17": (nothing, ["quantize", "{ckpt}", "--weights", "rtn", "--bits", "17", "--out", "{t}/q"],
                         "2..8"),
    "quantize/missing": (nothing, ["quantize", "{t}/none", "--weights", "rtn", "--bits", "4", "--out", "{t}/q"],
                         "does not exist"),
    "quantize/corrupt-tokenizer": (corrupt_tokenizer, ["quantize", "{ckpt}", "--weights", "gptq", "--bits", "4",
                                                       "--tokenizer", "{tok}", "--out", "{t}/q"], "corrupt"),
    # -- convert -------------------------------------------------------------------------------------------
    "convert/to-hf-over-source": (nothing, ["convert", "{ckpt}", "{ckpt}", "--to", "hf", "--overwrite"],
                                  "is the input"),
    "convert/to-hf-around-source": (nothing, ["convert", "{ckpt}", "{t}/..", "--to", "hf", "--overwrite"],
                                    "contains the input"),
    "convert/to-hf-inside-source": (nothing, ["convert", "{ckpt}", "{ckpt}/hf", "--to", "hf"], "lies inside"),
    "convert/from-hf-over-source": (hf, ["convert", "{hf}", "{hf}", "--from", "hf", "--overwrite"], "is the input"),
    "convert/from-hf-around-source": (hf, ["convert", "{hf}", "{t}", "--from", "hf", "--overwrite"], "contains"),
    "convert/from-hf-pickle": (lambda w, t: {"hf": h.pickle_only(hf(w, t)["hf"])},
                               ["convert", "{hf}", "{t}/out", "--from", "hf"], "pickle"),
    "convert/from-hf-shard-outside": (lambda w, t: {"hf": h.shard_outside(hf(w, t)["hf"])},
                                      ["convert", "{hf}", "{t}/out", "--from", "hf"], "inside"),
    # -- report --------------------------------------------------------------------------------------------
    "report/output-is-records": (nothing, ["report", "{records}", "--output", "{records}"], "is the input"),
    "report/plot-is-records": (nothing, ["report", "{records}", "--plot", "{records}"], "is the input"),
    "report/n-boot-0": (nothing, ["report", "{records}", "--n-boot", "0"], "--n-boot: must be"),
    "report/n-boot-huge": (nothing, ["report", "{records}", "--n-boot", "10000000"], "1..100000"),
    "report/seed-negative": (nothing, ["report", "{records}", "--seed", "-3"], "--seed"),
    "report/format": (nothing, ["report", "{records}", "--format", "docx"], "unknown format"),
    "report/binary": (lambda w, t: {"bin": h.junk(t / "r.jsonl")}, ["report", "{bin}"], "not a JSONL"),
    "report/metrics-not-object": (lambda w, t: h.records_with(w["records"], metrics=[1]) and {},
                                  ["report", "{records}"], "not a sweep record"),
    "report/unknown-kind": (lambda w, t: h.records_with(w["records"], kind="poetry") and {},
                            ["report", "{records}"], "not a sweep record"),
    "report/bits-string": (lambda w, t: h.records_with(w["records"], bits="16") and {}, ["report", "{records}"],
                           "bits must be an integer"),
    "report/metric-string": (lambda w, t: h.records_with(w["records"], metrics={"perplexity": "x", "loss": 1,
                                                                                "window_losses": []}) and {},
                             ["report", "{records}"], "numbers or null"),
    "report/missing": (nothing, ["report", "{t}/none.jsonl"], "not found"),
    # -- sweep: everything checked before a model is loaded -----------------------------------------------
    "sweep/out-is-checkpoint": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{text}",
                                          "--out", "{ckpt}"], "is the input"),
    "sweep/out-inside-checkpoint": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{text}",
                                              "--out", "{ckpt}/r.jsonl"], "lies inside"),
    "sweep/device-missing": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{text}",
                                       "--device", "cuda:7", "--out", "{t}/r.jsonl"], "not available"),
    "sweep/device-junk": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{text}",
                                    "--device", "toaster", "--out", "{t}/r.jsonl"], "unknown device"),
    "sweep/batch-size-0": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{text}",
                                     "--batch-size", "0", "--out", "{t}/r.jsonl"], "--batch-size: must be"),
    "sweep/threads-0": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{text}",
                                  "--threads", "0", "--out", "{t}/r.jsonl"], "--threads: must be"),
    "sweep/calib-tokens-0": (nothing, ["sweep", "{ckpt}", "--target", "weights-gptq", "--tasks", "{text}",
                                       "--calib-tokens", "0", "--out", "{t}/r.jsonl"], "--calib-tokens"),
    "sweep/already-quantized": (packed, ["sweep", "{q}", "--target", "attn_logits", "--tasks", "{text}",
                                         "--out", "{t}/r.jsonl"], "already quantized"),
    "sweep/group-size-0": (nothing, ["sweep", "{ckpt}", "--target", "weights-rtn", "--group-size", "0",
                                     "--tasks", "{text}", "--out", "{t}/r.jsonl"], "--group-size: must be"),
    "sweep/calib-data-missing": (nothing, ["sweep", "{ckpt}", "--target", "weights-gptq", "--tasks", "{text}",
                                           "--calib-data", "{t}/none.txt", "--out", "{t}/r.jsonl"], "no such corpus"),
    "sweep/calib-data-binary": (lambda w, t: {"bin": h.junk(t / "junk.txt")},
                                ["sweep", "{ckpt}", "--target", "weights-gptq", "--tasks", "{text}",
                                 "--calib-data", "{bin}", "--out", "{t}/r.jsonl"], "not a text file"),
    "sweep/task-binary": (lambda w, t: {"bin": h.junk(t / "junk.txt")},
                          ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks", "{bin}", "--out", "{t}/r.jsonl"],
                          "not a text file"),
    "sweep/out-is-task-file": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks",
                                         "wikitext2,{text}", "--out", "{text}"], "is the input tasks"),
    "sweep/out-is-task-path": (nothing, ["sweep", "{ckpt}", "--target", "attn_logits", "--tasks",
                                         "hellaswag:{records}", "--out", "{records}"], "is the input tasks"),
    # -- train and demo: the same rules reach every sub-command --------------------------------------------
    "train/tokens-0": (nothing, ["train", "--arch", "diff", "--tokens", "0", "--out", "{t}/run"], "--tokens"),
    "train/lr-nan": (nothing, ["train", "--arch", "diff", "--tokens", "10", "--lr", "nan", "--out", "{t}/run"],
                     "--lr: must be a finite"),
    "train/seq-len-0": (nothing, ["train", "--arch", "diff", "--tokens", "10", "--seq-len", "0", "--out", "{t}/r"],
                        "--seq-len"),
    "train/out-is-init": (nothing, ["train", "--arch", "diff", "--tokens", "10", "--init-from", "{ckpt}", "--out",
                                    "{ckpt}"], "is the input"),
    "train/device-missing": (nothing, ["train", "--arch", "diff", "--tokens", "10", "--device", "cuda:3", "--out",
                                       "{t}/r"], "not available"),
    "demo/out-around-pair": (nothing, ["demo", "--pair", "{ckpt}", "{ckpt}", "--out", "{t}/.."], "contains"),
    "demo/batch-size-0": (nothing, ["demo", "--batch-size", "0"], "--batch-size"),
    "cli/unknown-command": (nothing, ["explode"], "invalid choice"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_line_and_exit_2(case, work, tmp_path, capsys):
    setup, argv, words = CASES[case]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    extra = setup(work, scratch) or {}
    names = {**work, **extra, "t": scratch}
    before = fingerprint(*[p for p in names.values() if p.exists()])
    code, _, err = run_cli([a.format(**names) for a in argv], capsys)
    assert code == 2, err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1, err
    assert words in err, err
    assert "Traceback" not in err
    assert not re.search(r"(?<!\S)(\S+): \1 ", err), err  # each layer names the file once
    after = fingerprint(*[p for p in names.values() if p.exists()])
    assert {k: v for k, v in after.items() if k in before} == before  # no input changed


def test_unexpected_errors_are_one_line_with_the_verbose_hint(assets, capsys, monkeypatch):
    import diffquant.commands.info as info

    def bug(args):
        raise KeyError("layers.0.attn")

    monkeypatch.setattr(info, "run", bug)
    code, _, err = run_cli(["info", assets["ckpt"]], capsys)
    assert code == 1 and err.count("\n") == 1 and "KeyError" in err and "rerun with -v" in err
    with pytest.raises(KeyError):
        run_cli(["-v", "info", assets["ckpt"]], capsys)

