"""Train the project tokenizer (byte-level BPE, recipe in diffquant/tokenizer.py) and write calib/tokenizer.json.

Deterministic: rerunning it reproduces the shipped file byte for byte (tests/test_tokenizer.py checks).

    python experiments/train_tokenizer.py [--out calib/tokenizer.json] [--vocab-size 8192] [--check]
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import tempfile
from pathlib import Path

from diffquant.data import data_fingerprint, load_split
from diffquant.tokenizer import DEFAULT_VOCAB_SIZE, default_tokenizer_path, train_tokenizer

log = logging.getLogger("train_tokenizer")


def build(out: Path, vocab_size: int) -> str:
    """Train on the train split and save to ``out``; returns the file's sha256."""
    docs = load_split("train")
    log.info("train split: %d documents, fingerprint %s", len(docs), data_fingerprint(docs))
    tok = train_tokenizer([d.text for d in docs], vocab_size=vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out), pretty=True)
    return hashlib.sha256(out.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=default_tokenizer_path())
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    ap.add_argument("--check", action="store_true", help="retrain to a temp file and compare with --out")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.check:
        log.info("wrote %s sha256 %s", args.out, build(args.out, args.vocab_size))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = build(Path(tmp) / "tokenizer.json", args.vocab_size)
    shipped = hashlib.sha256(args.out.read_bytes()).hexdigest()
    log.info("shipped %s\nretrained %s\n%s", shipped, fresh, "identical" if fresh == shipped else "DIFFERENT")
    return 0 if fresh == shipped else 1


if __name__ == "__main__":
    sys.exit(main())
