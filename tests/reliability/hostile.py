"""Builders of hostile inputs: each takes the private copies of the assets (``work``) and a scratch folder and
returns the paths a case needs. The files are small; what they declare is not."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from diffquant import build_model, load_checkpoint


def edit_config(ckpt: Path, text: str | None = None, **changes) -> Path:
    """Rewrite the checkpoint's config.json: raw ``text``, or the JSON with ``changes`` applied."""
    file = ckpt / "config.json"
    if text is None:
        data = json.loads(file.read_text())
        data.update(changes)
        text = json.dumps(data)
    file.write_text(text)
    return ckpt


def header_bomb(file: Path, shape=(1 << 20, 1 << 20)) -> Path:
    """A safetensors file whose header declares a tensor of 4 TiB backed by 16 bytes."""
    header = json.dumps({"embed.weight": {"dtype": "F32", "shape": list(shape),
                                          "data_offsets": [0, 4 * shape[0] * shape[1]]}}).encode()
    file.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    return file


def truncate(file: Path, keep: float = 0.5) -> Path:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])
    return file


def int8_weights(ckpt: Path) -> Path:
    file = ckpt / "model.safetensors"
    tensors = load_file(str(file))
    save_file({k: v.to(torch.int8) for k, v in tensors.items()}, str(file))
    return ckpt


def hf_folder(ckpt: Path, out: Path) -> Path:
    from diffquant.checkpoint.hf import save_hf

    return save_hf(load_checkpoint(ckpt), out)


def pickle_only(folder: Path) -> Path:
    """An HF folder whose weights are only a pickle (``torch.load`` would run code from it)."""
    (folder / "model.safetensors").unlink()
    torch.save({"planted": 1}, folder / "pytorch_model.bin")
    return folder


def shard_outside(folder: Path) -> Path:
    """An HF folder whose shard index points two levels up."""
    weights = folder / "model.safetensors"
    outside = folder.parent.parent / "x.safetensors"
    weights.rename(outside)
    names = list(json.loads(outside.read_bytes()[8:8 + struct.unpack("<Q", outside.read_bytes()[:8])[0]]))
    index = {"weight_map": {n: "../../x.safetensors" for n in names if n != "__metadata__"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def hf_config_edit(folder: Path, **changes) -> Path:
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))
    return folder


def junk(file: Path, size: int = 4096) -> Path:
    file.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    return file


def records_with(file: Path, **changes) -> Path:
    """The first record of ``file`` with ``changes`` applied, as the only line."""
    rec = json.loads(file.read_text().splitlines()[0])
    rec.update(changes)
    file.write_text(json.dumps(rec) + "\n")
    return file


def gguf_zero_heads(path: Path) -> Path:
    from tests.test_gguf import _write  # the suite's own llama.cpp-layout GGUF writer

    from .conftest import tiny_config

    model = build_model(tiny_config(vocab_size=101))
    return _write(path, model, kv={"add_head_count": 0})
