"""Quantize and sweep any local HF causal LM natively (model types that do not convert to ours).

Llama and DiffLlama folders keep converting to our models (:mod:`diffquant.checkpoint.hf`); every other HF
folder (Qwen2, Mistral, GPT-2, Phi, Gemma, GPT-NeoX, ...) is loaded by transformers and wrapped in
:class:`~diffquant.hf_probes.HFProbed`, and :func:`~diffquant.quant.quantize_` works on it unchanged:

* weights (RTN, GPTQ) and Linear inputs: module swaps on the Linear layers inside the decoder blocks (GPT-2's
  ``Conv1D`` is swapped for the equal ``nn.Linear`` first); embeddings and ``lm_head`` stay float unless asked;
* hidden states: the wrapper's ``layers.{i}.out`` probes (forward hooks);
* attention logits: the wrapper's logit probes, for the model types it probes
  (:data:`~diffquant.hf_probes.LOGIT_MODEL_TYPES`); for any other, asking for them is a one-line error before
  any work (:func:`check_native`), never a row where nothing was quantized.

``quantize --out`` on such a folder writes an HF folder transformers loads as it is: the float model with the
**dequantized** weights (``(code - zero) · scale``, so its outputs equal our fake-quantized model's) and
``diffquant_quant.json`` saying what was quantized; it is no smaller than the float folder. Activation and logit
quantizers have no place in an HF folder, so ``--out`` refuses them (sweep them in memory instead).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from torch import nn

from .checkpoint import atomic_folder, checkpoint_format
from .checkpoint.hf import MODEL_TYPES
from .errors import UserError
from .hf_probes import HFProbed, load_hf_model, logits_unsupported_reason
from .kinds import ATTN_LOGITS, HIDDEN
from .quant.api import is_conv1d

log = logging.getLogger(__name__)

NOTE_FILE = "diffquant_quant.json"
NATIVE_KINDS = (HIDDEN, ATTN_LOGITS)  # the probe kinds HFProbed can have


def _hf_config(path: str | Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def is_native_hf(path: str | Path) -> bool:
    """An HF folder whose model type does not convert to ours (quantized and swept through HFProbed)."""
    if not Path(path).is_dir() or checkpoint_format(path) != "hf":
        return False
    model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type")
    return model_type not in MODEL_TYPES


def load_probed_hf(path: str | Path, device: str | torch.device = "cpu") -> HFProbed:
    """The folder's model, float32, on ``device``, wrapped in HFProbed (eager probed attention where it can)."""
    return HFProbed(load_hf_model(path).to(device))


load_native = load_probed_hf  # the old name; checkpoint.native.load_native reads diffquant's own folders


def check_native(path: str | Path, kinds) -> None:
    """Refuse, in one line, probe ``kinds`` the model does not have."""
    config = _hf_config(path)
    missing = sorted(set(kinds) - set(NATIVE_KINDS))
    if missing:
        raise UserError(f"{path}: HF models expose {' and '.join(NATIVE_KINDS)} probes only, not "
                        f"{', '.join(missing)}")
    if ATTN_LOGITS in kinds and (reason := logits_unsupported_reason(config)):
        raise UserError(f"{path}: {reason}; nothing would be quantized")


def conv1d_names(model: nn.Module) -> set[str]:
    """Names of the Conv1D modules (kept before quantizing, which swaps them for Linear layers)."""
    return {n for n, m in model.named_modules() if is_conv1d(m)}


def save_dequantized(model: HFProbed, out: str | Path, conv1d: set[str], note: dict, overwrite: bool = False,
                     extra_files: dict[str, Path] | None = None) -> Path:
    """Write ``model`` (weight-quantized) as an HF folder with dequantized weights plus ``diffquant_quant.json``
    (and ``extra_files``, name -> source file: the tokenizer)."""
    from .quant.api import iter_quantized
    from .quant.registry import HF_DEQUANTIZED, method_for_module, refuse_export

    hf = model.hf
    quantized = [(n.removeprefix("hf."), m) for n, m in iter_quantized(model)]
    if any(method_for_module(m) is None or getattr(m, "act", None) is not None for _, m in quantized):
        raise UserError("--out on an HF folder holds weight quantization only (RTN/GPTQ): activation and logit "
                        "quantizers live in memory; use `diffquant sweep` for them")
    for name, module in quantized:
        if refusal := refuse_export(method_for_module(module), HF_DEQUANTIZED, name):
            raise UserError(refusal)
    for name, module in quantized:
        hf.set_submodule(name, _dequantized(module, name in conv1d))
    with atomic_folder(out, overwrite) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        for name, src in (extra_files or {}).items():
            shutil.copyfile(src, Path(tmp) / name)
        (Path(tmp) / NOTE_FILE).write_text(json.dumps({**note, "dequantized": sorted(n for n, _ in quantized)},
                                                      indent=2))
    log.info("%s: %d dequantized weight matrices in a float HF folder", out, len(quantized))
    return Path(out)


def _dequantized(module, conv1d: bool) -> nn.Module:
    """A float ``nn.Linear`` (Conv1D, weight [in, out]; ``nn.Embedding``) holding ``module``'s dequantized weight."""
    weight = module.dequantized_weight(torch.float32)
    if not hasattr(module, "in_features"):  # QuantEmbedding (--embeddings)
        return nn.Embedding.from_pretrained(weight.clone(), freeze=False)
    bias = module.bias
    if conv1d:
        from transformers.pytorch_utils import Conv1D

        layer = Conv1D(module.out_features, module.in_features)
        with torch.no_grad():
            layer.weight.copy_(weight.T)
            layer.bias.copy_(bias if bias is not None else torch.zeros(module.out_features))
        return layer
    layer = nn.Linear(module.in_features, module.out_features, bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer
