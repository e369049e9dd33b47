"""One function decides the tokenizer of every model (diffquant.tokenizer.tokenizer_for): an HF folder without one
is refused in one line by sweep, profile and GPTQ calibration unless --tokenizer names one; a tokenizer with more
tokens than the model is refused; GGUF files' embedded vocabularies (llama and gpt2 styles) are read, and the
project's BPE tokenizer is written gpt2-style and read back token for token."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from diffquant import build_model, save_checkpoint
from diffquant.checkpoint.gguf import stories260k_path, stories260k_tokenizer_path
from diffquant.cli import main
from diffquant.data import load_documents
from diffquant.errors import UserError
from diffquant.gguf_export import save_gguf
from diffquant.tokenizer import Tokenizer, default_tokenizer, default_tokenizer_path, embedded_tokenizer, tokenizer_for

from .conftest import tiny_config
from .helpers import randomize_hf_

_SHAPE = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=64)
CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config}


def hf_folder(tmp_path, family, vocab_size=8192, tokenizer=False):
    torch.manual_seed(0)
    folder = tmp_path / f"{family}-{vocab_size}"
    randomize_hf_(AutoModelForCausalLM.from_config(CONFIGS[family](vocab_size=vocab_size, **_SHAPE)))\
        .save_pretrained(folder)
    if tokenizer:
        shutil.copyfile(default_tokenizer_path(), folder / "tokenizer.json")
    return folder


@pytest.fixture(autouse=True)
def _quiet_hf_progress(monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def one_line_error(capsys, needle):
    err = capsys.readouterr().err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1, err
    assert needle in err, err


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text(load_documents("tinystories-cased")[0].text[:1500])
    return path


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_folder_without_tokenizer_is_refused_by_sweep_profile_and_gptq(tmp_path, capsys, text, family):
    folder = hf_folder(tmp_path, family)
    out = tmp_path / "r.jsonl"
    assert main(["sweep", str(folder), "--target", "weights-rtn", "--bits", "16", "--tasks", str(text),
                 "--limit", "1", "--out", str(out)]) == 2
    one_line_error(capsys, "--tokenizer")
    assert not out.exists()
    assert main(["profile", str(folder), "--data", str(text), "--tokens", "64"]) == 2
    one_line_error(capsys, "--tokenizer")
    assert main(["quantize", str(folder), "--weights", "gptq", "--bits", "4", "--calib-tokens", "64",
                 "--out", str(tmp_path / "q")]) == 2
    one_line_error(capsys, "--tokenizer")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_folder_with_tokenizer_flag_is_swept(tmp_path, capsys, text, family):
    folder = hf_folder(tmp_path, family)
    out = tmp_path / "r.jsonl"
    assert main(["sweep", str(folder), "--target", "weights-rtn", "--bits", "16", "--tasks", str(text),
                 "--limit", "1", "--out", str(out), "--tokenizer", str(default_tokenizer_path()),
                 "--no-table"]) == 0
    assert tokenizer_for(folder, default_tokenizer_path()).vocab_size == 8192
    # the same model with its tokenizer in the folder gives the same tokenizer without the flag
    assert tokenizer_for(hf_folder(tmp_path / "b", family, tokenizer=True)).vocab_size == 8192


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, capsys, text):
    folder = hf_folder(tmp_path, "qwen2", vocab_size=1000)
    with pytest.raises(UserError, match="8192 tokens but .* only 1000"):
        tokenizer_for(folder, default_tokenizer_path())
    assert main(["profile", str(folder), "--data", str(text), "--tokens", "64",
                 "--tokenizer", str(default_tokenizer_path())]) == 2
    one_line_error(capsys, "only 1000 embedding rows")


def test_our_folder_without_tokenizer_takes_the_project_one_only_when_the_vocabulary_is_its(tmp_path):
    save_checkpoint(build_model(tiny_config(vocab_size=8192)), tmp_path / "fits")
    assert tokenizer_for(tmp_path / "fits").path == default_tokenizer().path
    save_checkpoint(build_model(tiny_config(vocab_size=9000)), tmp_path / "other")
    with pytest.raises(UserError, match="does not fit its vocabulary"):
        tokenizer_for(tmp_path / "other")
    shutil.copyfile(stories260k_tokenizer_path(), tmp_path / "other" / "tokenizer.model")
    assert tokenizer_for(tmp_path / "other").vocab_size == 512  # its own, smaller than the model: fine


def _texts():
    return [load_documents("tinystories-cased")[0].text[:20000], load_documents("wikitext2-test")[0].text[:20000],
            "naïve café — 東京 🙂\n\n  two  spaces"]


def test_llama_vocabulary_embedded_in_stories260k_equals_its_sentencepiece_model():
    embedded, sidecar = embedded_tokenizer(stories260k_path()), Tokenizer.load(stories260k_tokenizer_path())
    assert (embedded.kind, embedded.bos_id, embedded.eos_id, embedded.vocab_size) == ("sentencepiece", 1, 2, 512)
    for text in _texts():
        ids = sidecar.encode(text, bos=True)
        assert embedded.encode(text, bos=True) == ids
        assert embedded.decode(ids) == sidecar.decode(ids)


def test_project_bpe_written_gpt2_style_reads_back_token_for_token(tmp_path):
    model = build_model(tiny_config(vocab_size=8192, d_model=64, n_heads=2))
    path = tmp_path / "m.gguf"
    save_gguf(model, path, tokenizer=default_tokenizer())
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    back, project = tokenizer_for(path), default_tokenizer()
    assert (back.kind, back.bos_id, back.eos_id, back.vocab_size) == ("hf", 0, 0, 8192)
    for text in _texts():
        ids = project.encode(text, bos=True)
        assert back.encode(text, bos=True) == ids
        assert back.decode(ids) == project.decode(ids) and back.decode(ids[1:]) == text


def test_gguf_without_vocabulary_is_refused(tmp_path):
    path = tmp_path / "bare.gguf"
    save_gguf(build_model(tiny_config(vocab_size=8192, d_model=64, n_heads=2)), path)
    with pytest.raises(UserError, match="embeds no vocabulary"):
        tokenizer_for(path)
    assert tokenizer_for(path, default_tokenizer_path()).vocab_size == 8192
