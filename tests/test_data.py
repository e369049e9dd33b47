"""diffquant.data: normalisation, loading, splits, encoding (small fixtures plus the shipped calib/)."""
from __future__ import annotations

import bz2
import gzip
import lzma
import re

import numpy as np
import pytest

from diffquant import data as D

BODY = "It was the best of times,\nit was the worst of times.\n"


def _write(path, raw: bytes, kind: str = "txt"):
    path.parent.mkdir(parents=True, exist_ok=True)
    comp = {"txt": bytes, "xz": lzma.compress, "bz2": bz2.compress, "gz": gzip.compress}[kind]
    path.write_bytes(comp(raw))
    return path


# --- read_text -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["txt", "xz", "bz2", "gz"])
def test_read_text_compressed_bom_crlf(tmp_path, kind):
    raw = b"\xef\xbb\xbf" + BODY.replace("\n", "\r\n").encode()
    path = _write(tmp_path / ("a.txt" if kind == "txt" else f"a.txt.{kind}"), raw, kind)
    assert D.read_text(path) == BODY


def test_read_text_lone_cr_and_latin1(tmp_path):
    path = _write(tmp_path / "l1.txt", "C\xe6sar\rBruneti\xe8re\r\n".encode("latin-1"))
    assert D.read_text(path) == "C\u00e6sar\nBruneti\u00e8re\n"


def test_read_text_keeps_utf8(tmp_path):
    path = _write(tmp_path / "u.txt", "Les Misérables — “quoted” 日本\n".encode())
    assert D.read_text(path) == "Les Misérables — “quoted” 日本\n"


def test_strip_gutenberg_start_end():
    text = ("The Project Gutenberg EBook of X\nlicence blah\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n\n" + BODY +
            "\n\nEnd of the Project Gutenberg EBook of X, by Y\n\n"
            "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\n\nfooter licence\n")
    assert D.strip_gutenberg(text) == BODY


def test_strip_gutenberg_end_only_with_small_print_after():
    # chesterton-ball.txt: no START marker, END marker, then the old small print block
    text = (BODY + "\nEnd of Project Gutenberg's X, by Y\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n"
            "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***\nlegal\n"
            "*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.02/11/02*END*\n")
    assert D.strip_gutenberg(text) == BODY


def test_strip_gutenberg_old_small_print_header():
    text = ("header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n" + BODY)
    assert D.strip_gutenberg(text) == BODY


def test_strip_gutenberg_no_markers_unchanged():
    assert D.strip_gutenberg(" = Title = \n text <unk> \n") == " = Title = \n text <unk> \n"


def test_read_text_full_gutenberg_file(tmp_path):
    raw = ("\ufeffheader\r\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n" + BODY.replace("\n", "\r\n")
           + "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nfooter\r\n").encode()
    assert D.read_text(_write(tmp_path / "x.txt.xz", raw, "xz")) == BODY


# --- load_documents and errors ---------------------------------------------------------------------------

def _fake_calib(root):
    """A miniature calib/ with the real layout and names."""
    novels = ["Dracula_345", "Moby-Dick--Or-The-Whale_2701", "Pride-and-Prejudice_1342",
              "The-Adventures-of-Sherlock-Holmes_1661", "Ulysses_4300"]
    for n in novels:
        _write(root / f"corpus/gutenberg-novels/{n}.txt.xz", f"{n} text\n".encode(), "xz")
    (root / "corpus/gutenberg-novels/LICENSE").write_text("licence")
    for n in ["austen-emma", "melville-moby_dick"]:
        _write(root / f"corpus/nltk-gutenberg/{n}.txt.xz", f"{n} text\n".encode(), "xz")
    _write(root / "corpus/tinyshakespeare/input.txt.xz", b"First Citizen:\nSpeak.\n", "xz")
    stories = "\n".join(f"story {i} para a.\n\nstory {i} para b." for i in range(300)) + "\n"
    _write(root / "corpus/tinystories/tinystories_lowercased.txt.xz", stories.encode(), "xz")
    return root


def test_load_documents_named_sources_with_env(tmp_path, monkeypatch):
    monkeypatch.setenv(D.CALIB_ENV, str(_fake_calib(tmp_path)))
    assert D.calib_dir() == tmp_path
    novels = D.load_documents("gutenberg-novels")
    assert [d.name for d in novels][:2] == ["gutenberg-novels/Dracula_345",
                                           "gutenberg-novels/Moby-Dick--Or-The-Whale_2701"]
    assert len(novels) == 5  # LICENSE is not a document
    stories = D.load_documents("tinystories")
    assert len(stories) == 300
    assert stories[7] == D.Document("tinystories/00007", "story 7 para a.\n\nstory 7 para b.\n")


def test_load_documents_user_file_and_folder(tmp_path):
    _write(tmp_path / "mine/a.txt", b"alpha\r\n")
    _write(tmp_path / "mine/b.txt.gz", b"beta\n", "gz")
    assert D.load_documents(tmp_path / "mine/a.txt") == [D.Document("a", "alpha\n")]
    assert [d.text for d in D.load_documents(str(tmp_path / "mine"))] == ["alpha\n", "beta\n"]


def test_missing_corpus_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        D.load_documents("gutenberg-novels", calib=tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        D.load_documents("tinyshakespeare", calib=tmp_path)
    with pytest.raises(FileNotFoundError, match="no such corpus"):
        D.load_documents(tmp_path / "nope.txt")


def test_empty_corpus_raises(tmp_path):
    _write(tmp_path / "empty.txt", b"\xef\xbb\xbf\r\n\r\n")
    with pytest.raises(ValueError, match="no text"):
        D.load_documents(tmp_path / "empty.txt")
    (tmp_path / "corpus/gutenberg-novels").mkdir(parents=True)
    with pytest.raises(ValueError, match="no text"):
        D.load_documents("gutenberg-novels", calib=tmp_path)


# --- splits ----------------------------------------------------------------------------------------------

def test_split_fake_calib_assignment(tmp_path):
    root = _fake_calib(tmp_path)
    split = {s: [d.name for d in D.load_split(s, calib=root)] for s in D.SPLITS}
    assert split["validation"] == ["gutenberg-novels/The-Adventures-of-Sherlock-Holmes_1661"]
    assert split["test"] == ["gutenberg-novels/Dracula_345", "gutenberg-novels/Pride-and-Prejudice_1342"]
    assert "nltk-gutenberg/melville-moby_dick" not in split["train"]
    assert "tinystories/00292" not in split["train"] and "tinystories/00293" in split["train"]
    assert split["train"][:2] == ["gutenberg-novels/Moby-Dick--Or-The-Whale_2701", "gutenberg-novels/Ulysses_4300"]


def test_split_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown split"):
        D.load_split("dev", calib=tmp_path)
    root = _fake_calib(tmp_path)
    (root / "corpus/gutenberg-novels/The-Adventures-of-Sherlock-Holmes_1661.txt.xz").unlink()
    with pytest.raises(ValueError, match="empty"):
        D.load_split("validation", calib=root)


@pytest.fixture(scope="module")
def real_splits():
    return {s: D.load_split(s) for s in D.SPLITS}


@pytest.mark.slow  # ≥ 9 s (pytest --durations)
def test_real_splits_disjoint_and_deterministic(real_splits):
    names = {s: [d.name for d in docs] for s, docs in real_splits.items()}
    sets = {s: set(n) for s, n in names.items()}
    assert all(len(sets[s]) == len(names[s]) for s in D.SPLITS)
    assert not (sets["train"] & sets["validation"] or sets["train"] & sets["test"]
                or sets["validation"] & sets["test"])
    assert names["validation"] == list(D.VALIDATION) and names["test"] == list(D.TEST)
    # the same book never appears twice: NLTK's Moby Dick is dropped, the novel kept
    assert "nltk-gutenberg/melville-moby_dick" not in sets["train"]
    assert "gutenberg-novels/Moby-Dick--Or-The-Whale_2701" in sets["train"]
    texts = {s: {d.text for d in docs} for s, docs in real_splits.items()}
    assert not (texts["train"] & texts["test"] or texts["train"] & texts["validation"])
    assert D.data_fingerprint(D.load_split("validation")) == D.data_fingerprint(real_splits["validation"])


def test_real_train_excludes_cased_tinystories(real_splits):
    def paras(text):
        return {" ".join(p.lower().split()) for p in re.split(r"\n\s*\n", text) if len(p) > 80}

    cased = paras(D.load_documents("tinystories-cased")[0].text)
    stories = [d for d in real_splits["train"] if d.name.startswith("tinystories/")]
    assert len(stories) > 5000
    train = set().union(*(paras(d.text) for d in stories))
    assert not cased & train
    # and the excluded stories are exactly the overlap: the first one is the cased sample's first story
    first = D.load_documents("tinystories")[0].text
    assert " ".join(first.split())[:200] in " ".join(D.load_documents("tinystories-cased")[0].text.lower().split())


def test_real_files_are_clean(real_splits):
    docs = [d for s in real_splits.values() for d in s if not d.name.startswith("tinystories/")]
    docs += D.load_documents("nltk-gutenberg") + D.load_documents("wikitext2-test-raw")
    for d in docs:
        assert "\r" not in d.text and "\ufeff" not in d.text and "\x1a" not in d.text, d.name
        boilerplate = r"^(\*\*\* ?(START|END) OF|End of (the )?Project Gutenberg)"
        assert not re.search(boilerplate, d.text, re.MULTILINE | re.IGNORECASE)
        assert "SMALL PRINT" not in d.text and "www.gutenberg.org" not in d.text, d.name
    ball = next(d for d in docs if d.name == "nltk-gutenberg/chesterton-ball")
    assert "Brunetière" in ball.text and ball.text.endswith("pattern of a cross.\n")
    caesar = next(d for d in docs if d.name == "nltk-gutenberg/shakespeare-caesar")
    assert "C\u00e6sar" in caesar.text


def test_heldout_sources_load():
    for src in ("wikitext2-test", "wikitext2-valid", "wikitext2-test-raw", "tinystories-cased"):
        (doc,) = D.load_documents(src)
        assert len(doc.text) > 100_000
        assert D.assign_split(doc.name) is None


# --- encoding and fingerprints ---------------------------------------------------------------------------

class _CharTok:
    """Minimal stand-in: one id per character, BOS 0."""

    vocab_size, bos_id, eos_id = 300, 0, 0

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]


def test_encode_documents_separators_and_dtype():
    docs = [D.Document("a", "ab"), D.Document("b", "c")]
    ids = D.encode_documents(_CharTok(), docs)
    assert ids.dtype == np.uint16
    assert ids.tolist() == [0, 97, 98, 0, 99]
    assert D.encode_documents(_CharTok(), docs, bos=False).tolist() == [97, 98, 99]
    big = _CharTok()
    big.vocab_size = 100_000
    assert D.encode_documents(big, docs).dtype == np.int32
    with pytest.raises(ValueError):
        D.encode_documents(_CharTok(), [])


def test_data_fingerprint_order_and_content():
    a, b = D.Document("a", "x"), D.Document("b", "y")
    assert D.data_fingerprint([a, b]) == D.data_fingerprint([D.Document("other", "x"), b])
    assert D.data_fingerprint([a, b]) != D.data_fingerprint([b, a])
    assert D.data_fingerprint([D.Document("a", "xy")]) != D.data_fingerprint([a, b])
    assert len(D.data_fingerprint([a])) == 64
