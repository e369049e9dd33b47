"""Zero-shot task readers: the evaluation sets shipped under ``calib/eval`` as lists of :class:`Item`.

Every item is a set of (context, continuation) requests, one per choice, scored by the log-likelihood of the
continuation given the context (lm-eval's ``loglikelihood`` request). The prompts follow the llm-foundry
eval gauntlet (``scripts/eval/yamls/tasks_v0.3.yaml``) that produced the shipped jsonl files; they coincide
with lm-eval's templates for these tasks:

* ``query`` and choices are stripped (llm-foundry ``strip_dataset``); the context is ``query`` followed by the
  task's continuation delimiter minus its trailing space, the continuation is that space plus the choice
  (``"\\nAnswer: "`` for ARC-Easy, PIQA and BoolQ, ``" "`` otherwise). Moving the space into the continuation
  is what lm-eval's ``_encode_pair`` does, so ``"Question: q\\nAnswer:"`` + ``" choice"``.
* WinoGrande (llm-foundry "schema", lm-eval partial scoring): one context per option, the same continuation.
* HellaSwag: the shipped 6-lines-per-item text (``activity_label: ctx``, gold, four endings) gets lm-eval's
  ``preprocess`` (``" [title]"`` → ``". "``, bracketed bits removed, double spaces collapsed). lm-eval also
  capitalises ``ctx_b`` (the trailing fragment of ``ctx``); the text file joins ``ctx_a`` and ``ctx_b``, so the
  fragment after the last ``". "`` is capitalised when it starts lowercase (the ActivityNet items), which
  reproduces ``ctx_a + " " + ctx_b.capitalize()`` wherever ``ctx_b`` is that fragment.
* LAMBADA: one request, ``context`` + ``" " + continuation`` (the last word); ``gold`` is 0.

``acc_norm`` divides a choice's log-likelihood by ``len(choice)`` in characters, without the delimiter, as
lm-eval's ``completion_len``. ``Item.id`` is the item's index in its file, the key for pairing two runs.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .data import calib_dir, decode, read_bytes

log = logging.getLogger(__name__)

ANSWER_DELIMITER = "\nAnswer: "
HELLASWAG_LINES = 6  # "activity_label: ctx", gold, four endings


@dataclass(frozen=True)
class Item:
    """One task item: ``len(choices)`` requests ``(contexts[i] or contexts[0], delimiter + choices[i])``."""

    task: str
    id: int  # index of the item in its source file: the pairing key across runs
    contexts: tuple[str, ...]  # one shared context, or one per choice (WinoGrande)
    choices: tuple[str, ...]  # continuation texts without the delimiter (their length normalises acc_norm)
    gold: int
    delimiter: str = " "  # prepended to every choice (the whitespace lm-eval moves out of the context)

    def requests(self) -> list[tuple[str, str]]:
        """(context, continuation) per choice."""
        ctxs = self.contexts if len(self.contexts) > 1 else self.contexts * len(self.choices)
        return [(c, self.delimiter + ch) for c, ch in zip(ctxs, self.choices, strict=True)]


@dataclass(frozen=True)
class TaskSpec:
    file: str  # under calib/eval
    reader: str  # "mc" | "schema" | "lm" | "hellaswag"
    kind: str  # "multiple_choice" | "lambada": how evaluate scores it
    delimiter: str = " "  # llm-foundry continuation_delimiter


TASKS: dict[str, TaskSpec] = {
    "hellaswag": TaskSpec("hellaswag_val_full.txt.bz2", "hellaswag", "multiple_choice"),
    "arc_easy": TaskSpec("arc_easy.jsonl.xz", "mc", "multiple_choice", ANSWER_DELIMITER),
    "piqa": TaskSpec("piqa.jsonl.xz", "mc", "multiple_choice", ANSWER_DELIMITER),
    "winogrande": TaskSpec("winogrande.jsonl.xz", "schema", "multiple_choice"),
    "boolq": TaskSpec("boolq.jsonl.xz", "mc", "multiple_choice", ANSWER_DELIMITER),
    "openbookqa": TaskSpec("openbook_qa.jsonl.xz", "mc", "multiple_choice"),
    "copa": TaskSpec("copa.jsonl.xz", "mc", "multiple_choice"),
    "lambada": TaskSpec("lambada_openai.jsonl.xz", "lm", "lambada"),
}
ALIASES = {"arc-easy": "arc_easy", "openbook_qa": "openbookqa", "lambada_openai": "lambada"}


def task_names() -> list[str]:
    return list(TASKS)


def canonical_task(name: str) -> str:
    """The registered name of ``name`` (case-insensitive, a few lm-eval / llm-foundry aliases)."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return key


def task_spec(name: str) -> TaskSpec:
    return TASKS[canonical_task(name)]


def task_path(name: str, calib: str | os.PathLike | None = None) -> Path:
    base = Path(calib) if calib is not None else calib_dir()
    path = base / "eval" / task_spec(name).file
    if not path.is_file():
        raise FileNotFoundError(f"task data not found: {path} (set DIFFQUANT_CALIB or run experiments/make_calib.py)")
    return path


# ---------------------------------------------------------------------------------------------------- readers

def hellaswag_preprocess(text: str) -> str:
    """lm-eval's ``hellaswag.utils.preprocess``: WikiHow artefacts out, double spaces collapsed."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _capitalize_ctx_b(ctx: str) -> str:
    """``ctx_a + " " + ctx_b.capitalize()`` when ctx_b is the lowercase fragment after the last ". "."""
    head, sep, tail = ctx.rpartition(". ")
    if sep and tail[:1].islower():
        return head + sep + tail.capitalize()
    return ctx


def _hellaswag_query(first_line: str) -> str:
    label, sep, ctx = first_line.partition(": ")
    if not sep:
        raise ValueError(f"expected 'activity_label: ctx', got {first_line[:60]!r}")
    return hellaswag_preprocess(f"{label}: {_capitalize_ctx_b(ctx)}")


def _read_hellaswag(text: str, name: str, delimiter: str, where: str) -> list[Item]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % HELLASWAG_LINES:
        raise ValueError(f"{where}: {len(lines)} lines, not a multiple of {HELLASWAG_LINES} (HellaSwag text format)")
    items = []
    for i in range(0, len(lines), HELLASWAG_LINES):
        ctx, gold, *endings = lines[i:i + HELLASWAG_LINES]
        try:
            items.append(_item(name, len(items), (_hellaswag_query(ctx),),
                               [hellaswag_preprocess(e) for e in endings], int(gold), delimiter))
        except ValueError as e:
            raise ValueError(f"{where}:{i + 1}: {e}") from None
    return items


def _item(task: str, idx: int, contexts: Sequence[str], choices: Sequence[str], gold, delimiter: str) -> Item:
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ValueError(f"gold {gold!r} is not an index into {len(choices)} choices")
    if len(choices) < 1 or any(not isinstance(c, str) for c in (*contexts, *choices)):
        raise ValueError("contexts and choices must be non-empty lists of strings")
    return Item(task, idx, tuple(contexts), tuple(choices), gold, delimiter)


def _mc_item(task: str, idx: int, row: dict, delimiter: str) -> Item:
    """llm-foundry multiple_choice: {"query", "choices", "gold"}; the delimiter's trailing space moves out."""
    core = delimiter.rstrip(" ")
    space = delimiter[len(core):]
    return _item(task, idx, (row["query"].strip() + core,), [c.strip() for c in row["choices"]], row["gold"],
                 space)


def _schema_item(task: str, idx: int, row: dict, delimiter: str) -> Item:
    """llm-foundry schema: {"context_options", "continuation", "gold"}; partial scoring of the continuation."""
    contexts = [c.strip() for c in row["context_options"]]
    if len(contexts) < 2:
        raise ValueError("schema items need at least two context options")
    return _item(task, idx, contexts, [row["continuation"].strip()] * len(contexts), row["gold"], delimiter)


def _lm_item(task: str, idx: int, row: dict, delimiter: str) -> Item:
    """llm-foundry language_modeling: {"context", "continuation"}; one request, gold 0."""
    return _item(task, idx, (row["context"].strip(),), [row["continuation"].strip()], 0, delimiter)


_JSONL_READERS: dict[str, Callable[[str, int, dict, str], Item]] = {
    "mc": _mc_item, "schema": _schema_item, "lm": _lm_item}


def _read_jsonl(text: str, name: str, reader: str, delimiter: str, where: str) -> list[Item]:
    make = _JSONL_READERS[reader]
    items = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            items.append(make(name, len(items), row, delimiter))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
            raise ValueError(f"{where}:{lineno}: bad {reader} item ({detail})") from None
    return items


def read_items(path: str | os.PathLike, name: str, reader: str, delimiter: str = " ") -> list[Item]:
    """Items of any file in one of the shipped formats (reader "mc", "schema", "lm" or "hellaswag")."""
    if reader not in (*_JSONL_READERS, "hellaswag"):
        raise ValueError(f"unknown reader {reader!r}; choose one of mc, schema, lm, hellaswag")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task data not found: {path}")
    text = decode(read_bytes(path)).replace("\r\n", "\n")
    if reader == "hellaswag" and not _looks_like_jsonl(text):
        items = _read_hellaswag(text, name, delimiter, str(path))
    else:  # HellaSwag in llm-foundry jsonl (the test fixture) reads as plain multiple choice
        items = _read_jsonl(text, name, "mc" if reader == "hellaswag" else reader, delimiter, str(path))
    if not items:
        raise ValueError(f"task file {path} holds no items")
    return items


def _looks_like_jsonl(text: str) -> bool:
    return text.lstrip()[:1] == "{"


# ---------------------------------------------------------------------------------------------------- subsets

SUBSETS = ("first", "random")  # what --limit N keeps: the first N (lm-eval's convention) or a seeded subset


def limit_ids(n: int, limit: int, subset: str = "first", seed: int = 0) -> list[int]:
    """The indices ``--limit`` keeps of ``range(n)``: the first ``limit`` (as lm-eval's ``--limit``, so tasks of
    the same name score the same items) or, with ``subset="random"``, the seeded subset of :func:`subset_ids`."""
    if subset not in SUBSETS:
        raise ValueError(f"unknown subset {subset!r}; choose one of {', '.join(SUBSETS)}")
    if subset == "random":
        return subset_ids(n, limit, seed)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    return list(range(min(n, limit)))


def subset_ids(n: int, limit: int, seed: int = 0) -> list[int]:
    """A fixed pseudo-random subset of ``range(n)`` of size ``limit``, in file order.

    Items are ranked by sha256 of ``"{seed}:{id}"``, so the choice never depends on library versions and a
    smaller limit is always a subset of a larger one (same seed).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if limit >= n:
        return list(range(n))
    rank = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    return sorted(rank[:limit])


def load_task(name: str, limit: int | None = None, seed: int = 0, path: str | os.PathLike | None = None,
              calib: str | os.PathLike | None = None, subset: str = "first") -> list[Item]:
    """Items of a shipped task (see :data:`TASKS`), or of ``path`` read in that task's format.

    ``limit``: the first ``limit`` items, or a seeded subset with ``subset="random"`` (:func:`limit_ids`); ids
    stay the items' indices in the whole file.
    Raises ValueError for an unknown task, a malformed or empty file; FileNotFoundError when data is missing.
    """
    key = canonical_task(name)
    spec = TASKS[key]
    items = read_items(path if path is not None else task_path(key, calib), key, spec.reader, spec.delimiter)
    if limit is not None:
        items = [items[i] for i in limit_ids(len(items), limit, subset, seed)]
    log.info("task %s: %d items", key, len(items))
    return items
