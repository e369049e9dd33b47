"""Builders of the second pass's hostile inputs (issue 42): token corpora and their manifests, training runs and
their states, packed folders with tampered codes, native HF folders with missing or conflicting heads, and
special files (FIFOs, device nodes) where an output goes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffquant.checkpoint.gguf import stories260k_tokenizer_path
from diffquant.corpus import MANIFEST, TOKENIZER_NAMES

CORPUS_VOCAB = 512  # the stories260K tokenizer's, so the xs preset trains on it


def corpus(folder: Path, tokens: int = 4000, seed: int = 0, vocab: int = CORPUS_VOCAB) -> Path:
    """A token corpus as `diffquant sample` lays it out (random ids; the stories260K tokenizer beside them)."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab <= 1 << 16 else np.int32
    ids = np.random.default_rng(seed).integers(0, vocab, tokens).astype(dtype)
    ids.tofile(folder / "shard_00000.bin")
    manifest = {"vocab_size": vocab, "dtype": np.dtype(dtype).name, "bos_id": 1,
                "shards": [{"file": "shard_00000.bin", "tokens": tokens,
                            "sha256": hashlib.sha256(ids.tobytes()).hexdigest()}]}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    shutil.copyfile(stories260k_tokenizer_path(), folder / TOKENIZER_NAMES[0])
    return folder


def manifest_edit(folder: Path, shard: dict | None = None, **changes) -> Path:
    """Rewrite the corpus manifest: top-level ``changes``, and ``shard`` applied to the first shard."""
    file = folder / MANIFEST
    data = json.loads(file.read_text())
    data.update(changes)
    if shard:
        data["shards"][0].update(shard)
    file.write_text(json.dumps(data))
    return folder


def negative_ids(folder: Path) -> Path:
    """An int32 corpus (vocabulary over 65536) holding a negative id, with a matching sha256."""
    corpus(folder, tokens=64, vocab=70_000)
    ids = np.fromfile(folder / "shard_00000.bin", dtype=np.int32)
    ids[5] = -7
    ids.tofile(folder / "shard_00000.bin")
    return manifest_edit(folder, shard={"sha256": hashlib.sha256(ids.tobytes()).hexdigest()})


def trainer_edit(state: Path, text: str | None = None, drop: str | None = None, **changes) -> Path:
    file = state / "trainer.json"
    if text is None:
        data = json.loads(file.read_text())
        data.update(changes)
        data.pop(drop, None)
        text = json.dumps(data)
    file.write_text(text)
    return state


def log_tokens_of(run: Path, other: Path) -> Path:
    """Give ``run``'s train_log.json the train-token fingerprint of the corpus ``other`` (an edit meant to let a
    resume switch corpus)."""
    from diffquant.corpus import load_corpus

    file = run / "train_log.json"
    log = json.loads(file.read_text())
    log["data"]["train_tokens_sha256"] = hashlib.sha256(load_corpus(other).ids.tobytes()).hexdigest()
    file.write_text(json.dumps(log))
    return run


def packed_tamper(q: Path, module: str, tensor: str, index: tuple, value) -> Path:
    """Set one stored element of a packed folder (the scheme digest kept, as a deliberate edit would)."""
    file = q / "model.safetensors"
    with safe_open(str(file), "pt") as fh:
        metadata = fh.metadata()
    tensors = load_file(str(file))
    tensors[f"{module}.{tensor}"][index] = value
    save_file(tensors, str(file), metadata=metadata)
    return q


def quant_json_edit(q: Path, module: str, **changes) -> Path:
    file = q / "quant.json"
    info = json.loads(file.read_text())
    info["modules"][module].update(changes)
    file.write_text(json.dumps(info))
    return q


def native_hf(folder: Path, tie: bool = False, seed: int = 0) -> Path:
    """A tiny Qwen2 folder (an HF model type that is loaded natively, not converted)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from diffquant.tokenizer import default_tokenizer_path

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=8192, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    shutil.copyfile(default_tokenizer_path(), folder / "tokenizer.json")
    return folder


def hf_weights_edit(folder: Path, drop: str | None = None, **config) -> Path:
    """Drop a tensor from an HF folder's weights and/or change its config.json."""
    file = folder / "model.safetensors"
    if drop:
        tensors = load_file(str(file))
        tensors.pop(drop)
        save_file(tensors, str(file), metadata={"format": "pt"})
    cfg_file = folder / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), **config}))
    return folder


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def char_device(path: Path) -> Path:
    """A copy of /dev/null's device node (root only: the case is skipped elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def node_types(*paths: Path) -> dict[str, int]:
    """The file type (regular, folder, FIFO, device...) of each path and of everything under folders."""
    found = {}
    for p in paths:
        items = [p] + (sorted(p.rglob("*")) if p.is_dir() and not p.is_symlink() else [])
        for item in items:
            if os.path.lexists(item):
                found[str(item)] = stat.S_IFMT(os.lstat(item).st_mode)
    return found
