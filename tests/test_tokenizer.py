"""diffquant.tokenizer: the shipped BPE, SentencePiece loading, reproducible training."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from diffquant import data as D
from diffquant.tokenizer import (
    SPECIAL_TOKEN,
    Tokenizer,
    default_tokenizer,
    default_tokenizer_path,
    train_tokenizer,
)

UNICODE_TEXTS = [
    "",
    "Once upon a time, there was a little girl named Lily.",
    "  leading and trailing spaces, double  spaces\tand tabs\t\n\n\nnewlines  ",
    "Les Misérables — “curly quotes” ‘and’ dashes… ½ © ®",
    "decomposed e\u0301 vs composed é, Å Å, ﬁ ligature, ＦＵＬＬＷＩＤＴＨ",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flags 🇫🇷 and math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "control \x00\x01\x1b[31m red \x7f and CRLF\r\nline",
    "Ελληνικά, русский, עברית, العربية",
    "code: def f(x):\n    return x ** 2  # comment",
]


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


def test_shipped_tokenizer_properties(tok):
    assert tok.kind == "hf" and tok.vocab_size == 8192
    assert tok.bos_id == tok.eos_id == 0
    assert tok.backend.id_to_token(0) == SPECIAL_TOKEN
    assert tok.encode("Hello", bos=True)[0] == 0 and 0 not in tok.encode("Hello")


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 < i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids], skip_special=True) == text


def test_encode_batch_matches_encode(tok):
    assert tok.encode_batch(UNICODE_TEXTS) == [tok.encode(t) for t in UNICODE_TEXTS]


def test_compresses_english(tok):
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    assert len(text) / len(tok.encode(text)) > 3.5


def test_sentencepiece_stories260k():
    sp = Tokenizer.load(D.calib_dir() / "models/stories260K_tok512_from_gguf.model")
    assert sp.kind == "sentencepiece" and sp.vocab_size == 512
    assert sp.bos_id == 1 and sp.eos_id == 2
    text = "Once upon a time, there was a little girl named Lily."
    ids = sp.encode(text, bos=True)
    assert ids[0] == 1 and 1 not in ids[1:]
    assert sp.decode(ids) == text
    assert sp.encode_batch([text]) == [ids[1:]]


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing.json")


def test_load_in_memory_and_from_file_agree(tmp_path, tok):
    path = tmp_path / "t.json"
    tok.backend.save(str(path))
    again = Tokenizer.load(path)
    assert again.encode(UNICODE_TEXTS[3]) == tok.encode(UNICODE_TEXTS[3])


_SMALL_TRAIN = """
import sys
from diffquant import data as D
from diffquant.tokenizer import train_tokenizer
docs = D.load_documents("tinyshakespeare")
sys.stdout.write(train_tokenizer([docs[0].text[:200_000]], vocab_size=600).to_str(pretty=True))
"""


@pytest.mark.slow  # ≥ 9 s (pytest --durations)
def test_training_reproducible_across_processes():
    # separate processes get different Rust hash seeds: the merges must not depend on them
    text = D.load_documents("tinyshakespeare")[0].text[:200_000]
    here = train_tokenizer([text], vocab_size=600).to_str(pretty=True)
    there = subprocess.run([sys.executable, "-c", _SMALL_TRAIN], capture_output=True, text=True, check=True).stdout
    assert here == there
    model = json.loads(here)["model"]
    assert len(model["vocab"]) == 600 and model["vocab"][SPECIAL_TOKEN] == 0


@pytest.mark.slow  # ≥ 9 s (pytest --durations)
def test_shipped_file_reproduces_byte_for_byte(tmp_path):
    docs = D.load_split("train")
    out = tmp_path / "tokenizer.json"
    train_tokenizer([d.text for d in docs]).save(str(out), pretty=True)
    assert out.read_bytes() == default_tokenizer_path().read_bytes(), (
        hashlib.sha256(out.read_bytes()).hexdigest())
