"""Build calib/ from the shared data folder and write calib/README.md.

Rerunnable and deterministic: text files are compressed with xz preset 9 (same bytes every run for a
given liblzma), everything else is copied byte for byte. The README table lists, for every shipped file,
its source, licence, and the sha256 of both the shipped file and the original.

    python experiments/make_calib.py [--src ../shared/data] [--dst calib] [--readme-only]
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import lzma
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("make_calib")

ROOT = Path(__file__).resolve().parent.parent

PG = "public domain (USA); Project Gutenberg licence for header/footer (LICENSE)"
LLMF = "mosaicml/llm-foundry"


@dataclass(frozen=True)
class Item:
    src: str        # path under the shared data folder
    dst: str        # path under calib/
    source: str     # repository : path
    licence: str
    note: str = ""


def _novel(stem: str, gid: str) -> Item:
    return Item(f"corpus/gutenberg-novels/{stem}.txt", f"corpus/gutenberg-novels/{stem}.txt.xz",
                f"GITenberg/{stem.rsplit('_', 1)[0]}_{gid} : {gid}-0.txt", PG,
                "Project Gutenberg eBook #" + gid)


NOVELS = [("A-Tale-of-Two-Cities_98", "98"), ("Adventures-of-Huckleberry-Finn_76", "76"),
          ("Dracula_345", "345"), ("Frankenstein_84", "84"), ("Great-Expectations_1400", "1400"),
          ("Les-Mis-rables_135", "135"), ("Middlemarch_145", "145"),
          ("Moby-Dick--Or-The-Whale_2701", "2701"), ("Pride-and-Prejudice_1342", "1342"),
          ("The-Adventures-of-Sherlock-Holmes_1661", "1661"), ("Ulysses_4300", "4300"),
          ("War-and-Peace_2600", "2600")]

NLTK = ["austen-emma", "austen-persuasion", "austen-sense", "blake-poems", "chesterton-ball",
        "chesterton-brown", "chesterton-thursday", "melville-moby_dick", "milton-paradise",
        "shakespeare-caesar", "shakespeare-hamlet", "shakespeare-macbeth", "whitman-leaves"]

EVAL_JSONL = {"arc_easy": "ARC-Easy test; ARC CC BY-SA 4.0", "boolq": "BoolQ dev; CC BY-SA 3.0",
              "copa": "COPA; BSD-2-Clause", "lambada_openai": "LAMBADA-OpenAI test; CC BY 4.0",
              "openbook_qa": "OpenBookQA test; Apache-2.0", "piqa": "PIQA val; AFL-3.0",
              "winogrande": "WinoGrande dev; CC-BY"}

FIXTURES = ["hellaswag_small", "lambada_small", "mmlu_small", "piqa_small", "winograd_small"]

NLTK_SRC = "nltk/nltk : nltk_data/corpora/gutenberg/ (commit 4dc39fbf)"
TS = "TinyStories: CDLA-Sharing-1.0 (Eldan & Li 2023, arXiv 2305.07759)"
WT = "CC BY-SA 3.0 / GFDL (Merity et al. 2016, WikiText)"
GOLL = "mutablelogic/go-llama : testdata/"


def items() -> list[Item]:
    out = [_novel(s, g) for s, g in NOVELS]
    out.append(Item("corpus/gutenberg-novels/LICENSE", "corpus/gutenberg-novels/LICENSE",
                    "GITenberg (Project Gutenberg licence text)", "Project Gutenberg licence"))
    out += [Item(f"corpus/nltk-gutenberg/{n}.txt", f"corpus/nltk-gutenberg/{n}.txt.xz", NLTK_SRC,
                 "public domain") for n in NLTK]
    out.append(Item("corpus/nltk-gutenberg/README", "corpus/nltk-gutenberg/README", NLTK_SRC,
                    "public domain", "NLTK's notes and the removed Project Gutenberg header"))
    out.append(Item("corpus/tinyshakespeare/input.txt", "corpus/tinyshakespeare/input.txt.xz",
                    "karpathy/char-rnn : data/tinyshakespeare/input.txt", "public domain text"))
    out.append(Item("corpus/tinystories/tinystories_lowercased.txt",
                    "corpus/tinystories/tinystories_lowercased.txt.xz",
                    "Arnoochka/Transformer-Parallelism : tinystories.txt (911b9e73)", TS,
                    "lowercased by its uploader"))
    out.append(Item("corpus/tinystories/tinystories_sample_cased.txt",
                    "corpus/tinystories/tinystories_sample_cased.txt.xz",
                    "Niklas6/Mini_GPT : tinystories.txt", TS, "original casing"))
    out.append(Item("corpus/tinystories/LICENSE", "corpus/tinystories/LICENSE",
                    "Arnoochka/Transformer-Parallelism : LICENSE", "MIT (the uploader's repository)",
                    "repository licence kept with the file; the stories themselves are CDLA-Sharing-1.0"))
    for n in ("test.txt", "valid.txt"):
        out.append(Item(f"heldout/wikitext-2/{n}", f"heldout/wikitext-2/{n}.xz",
                        f"pytorch/examples : word_language_model/data/wikitext-2/{n}", WT))
    out.append(Item("heldout/wikitext-2/wiki.test.raw", "heldout/wikitext-2/wiki.test.raw.xz",
                    "Tylogi/TyloQuant : data/wikitext-2-raw/wiki.test.raw", WT, "CRLF, blank lines dropped"))
    out.append(Item("heldout/wikitext-2/README", "heldout/wikitext-2/README", "pytorch/examples", WT))
    out += [Item(f"eval/{n}.jsonl", f"eval/{n}.jsonl.xz", f"{LLMF} : scripts/eval/local_data/",
                 f"repo Apache-2.0; {lic}") for n, lic in EVAL_JSONL.items()]
    out.append(Item("eval/hellaswag_val_full.txt.bz2", "eval/hellaswag_val_full.txt.bz2",
                    "klosax/hellaswag_text_data (from rowanz/hellaswag)", "MIT",
                    "10,042 validation items, 6 lines each"))
    out.append(Item("eval/README.hellaswag.md", "eval/README.hellaswag.md", "klosax/hellaswag_text_data", "MIT"))
    out.append(Item("eval/EVAL_GAUNTLET.md", "eval/EVAL_GAUNTLET.md", f"{LLMF} : scripts/eval/local_data/",
                    "Apache-2.0"))
    out.append(Item("eval/LICENSE.llm-foundry", "eval/LICENSE.llm-foundry", f"{LLMF} : LICENSE", "Apache-2.0"))
    out += [Item(f"eval/fixtures/{n}.jsonl", f"eval/fixtures/{n}.jsonl", f"{LLMF} : tests/eval/local_data/",
                 "Apache-2.0") for n in FIXTURES]
    out.append(Item("models/stories260K.gguf", "models/stories260K.gguf", GOLL + "stories260K.gguf",
                    "MIT (llama2.c); repo Apache-2.0",
                    "from karpathy/tinyllamas via GGUF conversion; 260K-parameter Llama trained on TinyStories"))
    out.append(Item("models/stories260K_tok512_from_gguf.model", "models/stories260K_tok512_from_gguf.model",
                    "rebuilt from the vocabulary inside stories260K.gguf", "as the model",
                    "SentencePiece, 512 pieces, BOS 1, EOS 2"))
    out.append(Item("models/LICENSE.go-llama", "models/LICENSE.go-llama", "mutablelogic/go-llama : LICENSE",
                    "Apache-2.0"))
    out.append(Item("models/README.go-llama.md", "models/README.go-llama.md", GOLL + "README.md",
                    "Apache-2.0"))
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ship(src: Path, dst: Path) -> None:
    """Compress to xz (preset 9) when dst ends in .xz, else copy; skip when dst is already up to date."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.suffix == ".xz" and src.suffix != ".xz":
        data = lzma.compress(src.read_bytes(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)
        if not dst.exists() or dst.read_bytes() != data:
            dst.write_bytes(data)
    elif not dst.exists() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)


README_HEAD = """\
# calib/ — data shipped with diffquant

Generated by `experiments/make_calib.py` (do not edit by hand; rerun it). Every file was copied from
`../shared/data` (itself copied byte for byte from the public repositories below) and, for text, compressed
with xz preset 9. `diffquant.data.read_text` decompresses, decodes (utf-8-sig, latin-1 fallback), turns
CRLF into LF and drops Project Gutenberg headers and footers at read time, so the shipped bytes are the
original bytes. Nothing under `../shared` is read at run time. Override the folder with `DIFFQUANT_CALIB`.

## Licences and attribution

* Project Gutenberg texts (`corpus/gutenberg-novels`, `corpus/nltk-gutenberg`): public domain in the USA;
  the Project Gutenberg header/footer licence is kept in `corpus/gutenberg-novels/LICENSE` and
  `corpus/nltk-gutenberg/README`. The loader strips those headers and footers. NLTK corpus: Bird, Klein & Loper.
* Tiny Shakespeare: Andrej Karpathy's char-rnn (public-domain plays).
* TinyStories: Ronen Eldan and Yuanzhi Li, "TinyStories: How Small Can Language Models Be and Still Speak
  Coherent English?" (2023), CDLA-Sharing-1.0 (`corpus/tinystories/LICENSE`).
* WikiText-2: Stephen Merity et al., "Pointer Sentinel Mixture Models" (2016), CC BY-SA 3.0 / GFDL.
* Evaluation sets: llm-foundry (MosaicML, Apache-2.0, `eval/LICENSE.llm-foundry`) local eval data; each set
  keeps its upstream licence (ARC CC BY-SA 4.0, PIQA AFL-3.0, WinoGrande CC-BY, BoolQ CC BY-SA 3.0, LAMBADA
  CC BY 4.0, OpenBookQA Apache-2.0, COPA BSD-2). HellaSwag (Zellers et al. 2019, MIT) via klosax/hellaswag_text_data.
* `models/stories260K.gguf`: Andrej Karpathy's llama2.c / tinyllamas (MIT), GGUF from mutablelogic/go-llama
  (Apache-2.0, `models/LICENSE.go-llama`).
* `corpus/tinystories/LICENSE` is the MIT licence of the uploader's repository (Victor Koloskov),
  kept with the file.
* `tokenizer.json`: trained in this project by `experiments/train_tokenizer.py` on the train split
  (MIT, as the project).

## Splits (`diffquant.data.load_split`)

By whole document (book), fixed lists in `diffquant/data.py`:

* **validation**: Gutenberg novel *The Adventures of Sherlock Holmes* (#1661).
* **test**: Gutenberg novels *Dracula* (#345) and *Pride and Prejudice* (#1342).
* **train**: the other 9 Gutenberg novels; the NLTK Gutenberg texts except `melville-moby_dick` (the same book
  as novel #2701, which is already in train); tiny Shakespeare; TinyStories lowercased, one document per
  story, minus its first 293 stories (those are the stories of `tinystories_sample_cased`, lowercased).
* Never in a split: `tinystories_sample_cased` (used to evaluate stories260K) and WikiText-2 (held-out domain).

## Tokenizer (`tokenizer.json`)

Byte-level BPE trained with the `tokenizers` library by `experiments/train_tokenizer.py` (recipe in
`diffquant/tokenizer.py`): no normaliser; pre-tokenizer ByteLevel(add_prefix_space=False, use_regex=True);
ByteLevel decoder; no post-processor; one special token `<|endoftext|>` (id 0: BOS, EOS and document
separator); BpeTrainer(vocab_size=8192, min_frequency=2, initial_alphabet=the 256 ByteLevel symbols); input =
the train split's documents, one string each, in `load_split("train")` order; single-threaded
(TOKENIZERS_PARALLELISM=false); saved pretty-printed. `python experiments/train_tokenizer.py --check` retrains
and compares the bytes.

## Files
"""


def readme(dst: Path, src: Path, listed: list[Item]) -> str:
    rows = ["| shipped file | source repository : path | licence | notes | sha256 shipped | sha256 original |",
            "|---|---|---|---|---|---|"]
    for it in listed:
        rows.append(f"| `{it.dst}` | {it.source} | {it.licence} | {it.note} | `{sha256(dst / it.dst)}` "
                    f"| `{sha256(src / it.src)}` |")
    tok = dst / "tokenizer.json"
    if tok.exists():
        rows.append(f"| `tokenizer.json` | this project: experiments/train_tokenizer.py | MIT | byte-level BPE, "
                    f"8192 tokens, trained on the train split | `{sha256(tok)}` | (generated) |")
    return README_HEAD + "\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--dst", type=Path, default=ROOT / "calib")
    ap.add_argument("--readme-only", action="store_true", help="only rewrite calib/README.md")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    listed = items()
    if not args.readme_only:
        for it in listed:
            log.info("%s -> %s", it.src, it.dst)
            ship(args.src / it.src, args.dst / it.dst)
    (args.dst / "README.md").write_text(readme(args.dst, args.src, listed), encoding="utf-8")
    log.info("wrote %s", args.dst / "README.md")


if __name__ == "__main__":
    main()
