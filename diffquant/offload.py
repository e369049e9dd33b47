"""Models larger than one device: Hugging Face folders loaded with accelerate's ``device_map``.

``load_dispatched(path, device_map="auto", max_memory={0: "20GiB", "cpu": "64GiB"})`` lets transformers and
accelerate place each decoder layer on a GPU, in CPU memory or on disk and returns the model wrapped in
:class:`~diffquant.hf_probes.HFProbed`, so probes, ``profile``, the logit / activation quantizers and GPTQ work
on it unchanged. Disk-offloaded safetensors weights are read in place; ``offload_folder`` (default: a temporary
folder kept for the process's lifetime) takes only what must be converted. :mod:`diffquant.dispatch` holds the
two places that needed care. The command line offers the same through
``--device-map auto --max-memory 0=20GiB,cpu=64GiB [--offload-folder DIR]``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

import torch
from torch import nn

from . import distributed
from .errors import UserError

log = logging.getLogger(__name__)

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_SCRATCH: list[tempfile.TemporaryDirectory] = []
_SIZE = re.compile(r"^\d+(\.\d+)?\s*([KMGT]i?B|B)?$", re.IGNORECASE)


def parse_max_memory(text: str | None) -> dict[int | str, str] | None:
    """``"0=20GiB,cpu=64GiB"`` -> ``{0: "20GiB", "cpu": "64GiB"}`` (keys: GPU indices, ``cpu``, ``mps``)."""
    if text is None:
        return None
    budget: dict[int | str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, size = (s.strip() for s in part.partition("="))
        if not sep or not _SIZE.match(size) or not (key.isdigit() or key in ("cpu", "mps")):
            raise UserError(f"--max-memory: cannot read {part!r}; expected DEVICE=SIZE pairs such as "
                            "0=20GiB,cpu=64GiB (DEVICE: a GPU index, cpu or mps)")
        budget[int(key) if key.isdigit() else key] = size if not size.isdigit() else int(size)
    if not budget:
        raise UserError("--max-memory is empty; expected DEVICE=SIZE pairs such as 0=20GiB,cpu=64GiB")
    return budget


def for_rank(max_memory: dict | None, local_rank: int | None = None) -> dict | None:
    """In a data-parallel launch, GPU indices are relative to the rank's own GPUs: with k GPU entries, local rank r
    uses GPUs r·k … r·k + k − 1 (``0=75GiB,1=75GiB`` on 8 GPUs: 4 ranks, a pair each). Unchanged otherwise."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) if distributed.is_distributed() else 0
    if not max_memory or not local_rank:
        return max_memory
    gpus = sorted(k for k in max_memory if isinstance(k, int))
    return {(local_rank * len(gpus) + gpus.index(k) if isinstance(k, int) else k): v for k, v in max_memory.items()}


def _device_map(value: str | dict) -> str | dict:
    if isinstance(value, dict) or value in DEVICE_MAPS:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise UserError(f"--device-map must be one of {', '.join(DEVICE_MAPS)} or a JSON object "
                        f'{{"module": device}}, got {value!r}')
    return parsed


def load_dispatched(path: str | Path, device_map: str | dict = "auto", max_memory: dict | None = None,
                    offload_folder: str | Path | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """An HF causal LM folder dispatched by accelerate over GPUs, CPU memory and disk, wrapped in ``HFProbed``."""
    from .checkpoint.hf import is_hf_folder
    from .hf_probes import HFProbed, load_hf_model

    if not (Path(path).is_dir() and is_hf_folder(path)):
        raise UserError(f"{path}: --device-map needs a Hugging Face model folder; write one with "
                        "`diffquant convert CKPT --to hf --out DIR`")
    try:
        import accelerate  # noqa: F401 - transformers needs it for device_map
    except ImportError:
        raise UserError("--device-map needs accelerate: pip install 'diffquant[big]'") from None
    if offload_folder is None:  # disk offload needs a folder: a private one, removed when the process ends
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="diffquant-offload-"))  # (copies of the model share it)
        offload_folder = _SCRATCH[-1].name
    model = load_hf_model(path, dtype, device_map=_device_map(device_map), max_memory=for_rank(max_memory),
                          offload_folder=str(offload_folder))
    log.info("%s dispatched: %s", path, _placement(getattr(model, "hf_device_map", {})))
    return HFProbed(model)


def _placement(device_map: dict) -> str:
    counts: dict[str, int] = {}
    for where in device_map.values():
        counts[str(where)] = counts.get(str(where), 0) + 1
    return ", ".join(f"{n} modules on {d}" for d, n in counts.items())


def add_arguments(parser) -> None:
    """The command-line flags of :func:`load_dispatched` (profile, sweep)."""
    parser.add_argument("--device-map", default=None,
                        help=f"HF folders: place layers with accelerate ({' | '.join(DEVICE_MAPS)} or a JSON map)")
    parser.add_argument("--max-memory", default=None,
                        help="with --device-map: budget per device, e.g. 0=20GiB,1=20GiB,cpu=64GiB (the rest "
                             "is offloaded to disk)")
    parser.add_argument("--offload-folder", default=None,
                        help="with --device-map: where disk-offloaded weights go (default: a temporary folder)")


def dispatch_options(args) -> dict | None:
    """``load_dispatched`` keyword arguments from parsed flags; None without ``--device-map``."""
    device_map, max_memory, folder = (getattr(args, k, None) for k in ("device_map", "max_memory", "offload_folder"))
    if device_map is None:
        if max_memory or folder:
            raise UserError("--max-memory and --offload-folder need --device-map")
        return None
    return {"device_map": _device_map(device_map), "max_memory": parse_max_memory(max_memory),
            "offload_folder": folder}
