"""Probes on Hugging Face causal LMs, natively: ``profile(HFProbed(model), batches)`` works unchanged.

``HFProbed`` wraps a transformers model and owns ``Probe`` modules named like ours, so ``probes()``,
``hooked()`` and ``profile()`` find them:

* ``layers.{i}.out`` (kind "hidden") — every decoder layer's output, for any architecture whose decoder layers
  sit in one ``ModuleList`` (found through the model's ``_no_split_modules``, the class names transformers
  itself uses to keep a layer on one device). A PyTorch forward hook, attached only while the wrapper runs,
  passes the layer output (or the first item of a tuple output) through the probe.
* ``layers.{i}.attn.logits`` (kind "attn_logits") — the pre-mask logits ``q·kᵀ·scaling`` after RoPE, for the
  model types in :data:`LOGIT_MODEL_TYPES` without sliding windows, except Mistral, whose window is respected:
  the softmax adds HF's own sliding-window mask for the layer, and the probe's ``window`` makes observers and
  quantizers count the logits inside the window only. They come from transformers' supported
  extension point, the attention-function registry: :func:`probed_eager_attention` is registered as
  ``"diffquant_eager"`` (``AttentionInterface``, with HF's eager mask through ``AttentionMaskInterface``) and
  selected with ``model.set_attn_implementation`` for the duration of a forward; it computes exactly what HF's
  ``eager_attention_forward`` computes, with the logits passing through the layer's probe. Nothing in
  transformers is patched.

DiffLlama routes through the same registry, but calls the attention function **twice** per layer with the same
query and key tensors (once per half of the value, ``DiffLlamaAttention.forward``). The probe fires on the
first call only; the second reuses the probe's replacement if a hook changed the logits (a quantizer), so both
halves see the same logits and observers count every logit once. Its 2H half-heads (head i pairs with
i + H) are shown in our Diff layout [B, H, 2, T, S] (map 0 = Q1K1ᵀ, 1 = Q2K2ᵀ); Llama-family logits are
[B, H, T, S]. Like our models' ``impl``/``chunk``, ``HFProbed.impl`` is "eager" (probed) or "hf" (the model's
own attention, no logit probes) and ``chunk`` computes eager attention in query chunks for long inputs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .checkpoint import load_checkpoint
from .checkpoint.compressed import is_compressed_folder
from .checkpoint.files import CheckpointError, check_capacity
from .checkpoint.hf import is_hf_folder, weight_files
from .config import SIZE_LIMITS
from .errors import first_line
from .kinds import ATTN_LOGITS, HIDDEN
from .probes import Probe

log = logging.getLogger(__name__)

ATTN_IMPL = "diffquant_eager"
# Model types whose attention calls the registry with the standard (query, key, value, mask, scaling) contract
# and whose eager attention is softmax(q·kᵀ·scaling + mask)·v; each is checked against HF's own eager
# probabilities in tests/test_hf_probes.py. Gemma (1) has no softcapping or sliding window (Gemma 2/3 do: left
# out); Phi and GPT-NeoX (partial RoPE) pass their own scaling; Mistral's sliding window comes with HF's mask.
LOGIT_MODEL_TYPES = ("llama", "diffllama", "mistral", "qwen2", "gpt2", "phi", "gemma", "gpt_neox")
IMPLS = ("eager", "hf")


# -- the attention function -------------------------------------------------------------------------------

@dataclass
class _Pending:
    """DiffLlama: the first of a layer's two calls, and the logits a hook put in place of each chunk's (or None)."""

    query: torch.Tensor
    key: torch.Tensor
    replaced: list[torch.Tensor | None] = field(default_factory=list)


@dataclass
class _Run:
    """State of one probed forward: which probe belongs to which HF attention module."""

    probes: dict[nn.Module, Probe]
    two_calls: set[nn.Module]
    chunk: int | None
    pending: dict[nn.Module, _Pending] = field(default_factory=dict)
    called: set[nn.Module] = field(default_factory=set)


_RUN: ContextVar[_Run | None] = ContextVar("diffquant_hf_run", default=None)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, K, S, d) -> (B, K·n_rep, S, d), kv head g serving query heads g·n_rep ... (HF's repeat_kv)."""
    if n_rep == 1:
        return x
    B, K, S, d = x.shape
    return x[:, :, None].expand(B, K, n_rep, S, d).reshape(B, K * n_rep, S, d)


def probed_eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None = None,
                           dropout: float = 0.0, **kwargs):
    """HF's eager attention with the pre-mask logits passing through the layer's probe (when one is active)."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    n_rep = getattr(module, "num_key_value_groups", 1)
    key_states, value_states = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    run = _RUN.get()
    probe = run.probes.get(module) if run is not None else None
    if probe is not None:
        run.called.add(module)
    T, S = query.shape[-2], key_states.shape[-2]
    step = (run.chunk if run is not None else None) or T
    pending = _take_pending(run, module, query, key) if probe is not None else None
    record = None
    if probe is not None and pending is None and module in run.two_calls:
        record = run.pending[module] = _Pending(query, key)
    outs, weights = [], None
    for n, q0 in enumerate(range(0, T, step)):
        q = query[:, :, q0:q0 + step]
        visible = S if step == T else S - T + q0 + q.shape[-2]  # causal: later keys are masked anyway
        scores = torch.matmul(q, key_states[:, :, :visible].transpose(2, 3)) * scaling  # (B, N, C, S')
        if pending is not None:
            if pending.replaced[n] is not None:
                scores = pending.replaced[n]
        elif probe is not None:
            scores, replaced = _through_probe(probe, scores, S - T + q0, module in run.two_calls)
            if record is not None:
                record.replaced.append(replaced)
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, q0:q0 + step, :visible]
        probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        probs = nn.functional.dropout(probs, p=dropout, training=module.training)
        outs.append(torch.matmul(probs, value_states[:, :, :visible]))
        weights = probs if step == T else None  # chunked: keeping every chunk's probabilities would cost O(T·S)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), weights


def _take_pending(run: _Run, module: nn.Module, query: torch.Tensor, key: torch.Tensor) -> _Pending | None:
    """DiffLlama's second call (same query and key objects as the first): the first call's record."""
    pending = run.pending.get(module)
    if pending is not None and pending.query is query and pending.key is key:
        return run.pending.pop(module)
    return None


def _through_probe(probe: Probe, scores: torch.Tensor, q_offset: int, diff: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pass logits (B, N, C, S) through ``probe`` in our layout; also return them if a hook replaced them."""
    if not diff:
        shown = probe(scores, q_offset)
        return shown, (None if shown is scores else shown)
    B, N, C, S = scores.shape
    maps = scores.view(B, 2, N // 2, C, S).transpose(1, 2)  # (B, H, 2, C, S): half-head i + m·H = map m of head i
    shown = probe(maps, q_offset)
    if shown is maps:
        return scores, None
    back = shown.transpose(1, 2).reshape(B, N, C, S)
    return back, back


def register_attention() -> None:
    """Register ``"diffquant_eager"`` (idempotent) with HF's eager mask, so masks are built as for "eager"."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTN_IMPL, probed_eager_attention)
    AttentionMaskInterface.register(ATTN_IMPL, eager_mask)


# -- finding the decoder layers ---------------------------------------------------------------------------

def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList of decoder layers: the longest list of modules of a class named in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)
             and all(type(layer).__name__ in names for layer in m)]
    if not found:
        n = _text_config(model).to_dict().get("num_hidden_layers")
        found = [m for m in model.modules() if isinstance(m, nn.ModuleList) and n and len(m) == n]
    if not found:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
    return max(found, key=len)


def _text_config(model: nn.Module):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _attention_module(layer: nn.Module) -> nn.Module | None:
    for name in ("self_attn", "attn", "attention"):
        mod = getattr(layer, name, None)
        if isinstance(mod, nn.Module):
            return mod
    return None


def logits_supported(config) -> bool:
    """Attention logits are probed for :data:`LOGIT_MODEL_TYPES` with plain causal masks, or Mistral's one window."""
    data = config.to_dict()
    if data.get("model_type") not in LOGIT_MODEL_TYPES:
        return False
    if data.get("model_type") == "mistral":
        return True
    layer_types = data.get("layer_types") or []
    sliding = data.get("sliding_window") is not None and data.get("use_sliding_window", True)
    return not sliding and all(t == "full_attention" for t in layer_types)


def sliding_window(config) -> int | None:
    """The keys a query sees (None: all earlier ones): Mistral's ``sliding_window`` (its mask uses it when set)."""
    data = config.to_dict()
    return data.get("sliding_window") if data.get("model_type") == "mistral" else None


def logits_unsupported_reason(config) -> str | None:
    """Why attention logits of this config cannot be probed (None: they can)."""
    if logits_supported(config):
        return None
    model_type = config.to_dict().get("model_type")
    if model_type not in LOGIT_MODEL_TYPES:
        return (f"attention logits of {model_type!r} models cannot be observed (probed model types: "
                f"{', '.join(LOGIT_MODEL_TYPES)})")
    return f"attention logits of this {model_type!r} model cannot be observed (sliding-window layers)"


# -- the wrapper ------------------------------------------------------------------------------------------

class HFConfig:
    """What diffquant reads from a model config (``max_seq_len``, ``arch``, ``to_dict``), for an HF model."""

    def __init__(self, hf_config):
        self.hf = hf_config
        data = hf_config.to_dict()
        self.model_type = data.get("model_type", "unknown")
        self.arch = {"llama": "transformer", "diffllama": "diff"}.get(self.model_type, self.model_type)
        self.max_seq_len = int(data.get("max_position_embeddings") or data.get("n_positions") or 2048)
        self.vocab_size = data.get("vocab_size")
        self.n_layers = data.get("num_hidden_layers", data.get("n_layer"))

    def to_dict(self) -> dict:
        return {"arch": self.arch, "source": "hf", "model_type": self.model_type, "max_seq_len": self.max_seq_len,
                "vocab_size": self.vocab_size, "n_layers": self.n_layers,
                "hf_config": json.loads(self.hf.to_json_string(use_diff=False))}


class _AttnProbes(nn.Module):
    def __init__(self, window: int | None = None):
        super().__init__()
        self.logits = Probe(ATTN_LOGITS)
        self.logits.window = window


class _LayerProbes(nn.Module):
    def __init__(self, with_logits: bool, window: int | None = None):
        super().__init__()
        if with_logits:
            self.attn = _AttnProbes(window)
        self.out = Probe(HIDDEN)


class HFProbed(nn.Module):
    """A transformers causal LM with our probes: ``forward(input_ids [B, T]) -> logits [B, T, V]``.

    The wrapped model is used as it is (``self.hf``); nothing about it changes outside a forward call.
    """

    def __init__(self, model: nn.Module, chunk: int | None = None):
        super().__init__()
        self.hf = model
        self.config = HFConfig(_text_config(model))
        self.with_logits = logits_supported(self.config.hf)
        n = len(decoder_layers(model))
        window = sliding_window(self.config.hf)
        self.layers = nn.ModuleList(_LayerProbes(self.with_logits, window) for _ in range(n))
        self.impl = "eager" if self.with_logits else "hf"
        self.chunk = chunk
        if self.with_logits:
            register_attention()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.ndim != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be an integer tensor [B, T], got {tuple(input_ids.shape)} "
                             f"{input_ids.dtype}")
        if self.impl not in IMPLS:
            raise ValueError(f"unknown impl {self.impl!r}; expected one of {', '.join(IMPLS)}")
        with self._attached():
            return self.hf(input_ids=input_ids, use_cache=False).logits

    @contextmanager
    def _attached(self) -> Iterator[None]:
        with ExitStack() as stack:
            layers = decoder_layers(self.hf)
            for layer, probes in zip(layers, self.layers, strict=True):
                handle = layer.register_forward_hook(_hidden_hook(probes.out))
                stack.callback(handle.remove)
            if self.impl == "eager" and self.with_logits:
                stack.enter_context(self._probed_attention(layers))
            yield

    @contextmanager
    def _probed_attention(self, layers: nn.ModuleList) -> Iterator[None]:
        attns = [_attention_module(layer) for layer in layers]
        if any(a is None for a in attns):
            raise ValueError(f"cannot find the attention modules of {type(self.hf).__name__}")
        two_calls = {a for a in attns if self.config.model_type == "diffllama"}
        run = _Run({a: p.attn.logits for a, p in zip(attns, self.layers, strict=True)}, two_calls, self.chunk)
        previous = self.hf.config._attn_implementation
        self.hf.set_attn_implementation(ATTN_IMPL)
        token = _RUN.set(run)
        try:
            yield
        finally:
            _RUN.reset(token)
            self.hf.set_attn_implementation(previous)
        if len(run.called) < len(attns):  # e.g. a transformers version whose attention bypasses the registry
            raise RuntimeError(f"{type(self.hf).__name__}: {len(attns) - len(run.called)} attention layers did "
                               f"not call the {ATTN_IMPL!r} attention function; their logits cannot be probed")


def _hidden_hook(probe: Probe):
    """Forward hook on a decoder layer: its output (tensor, or a tuple's first item) through ``probe``."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        shown = probe(hidden)
        if shown is hidden:
            return None
        return (shown, *output[1:]) if isinstance(output, tuple) else shown

    return hook


# -- loading ----------------------------------------------------------------------------------------------

def load_hf_model(path: str | Path, dtype: torch.dtype = torch.float32, **dispatch):
    """A local HF causal LM folder, offline, with no remote code and no pickle, in eval mode (``dispatch``:
    ``device_map`` / ``max_memory`` / ``offload_folder`` for transformers, see :mod:`diffquant.offload`).

    Checked before anything is allocated: the config's sizes, the shard paths and safetensors headers, and that
    the weights can hold the model the config describes (built on the meta device), quantized ones included."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not is_hf_folder(path):
        raise CheckpointError(f"{path} is not a Hugging Face model folder (config.json with model_type)")
    config = _checked_config(path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    check_capacity(path, sum(p.numel() for p in skeleton.parameters()), weight_files(path))
    _check_tied_head(path, config, skeleton)
    try:
        with _quiet_transformers():  # its load report is ours to give, in one line
            model, info = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=dtype, trust_remote_code=False, use_safetensors=True,
                output_loading_info=True, **dispatch)
    except RuntimeError:  # transformers' size-mismatch report
        raise CheckpointError(f"{path}: config does not match the weights (tensor shapes differ from what "
                              "config.json implies)") from None
    except ImportError as exc:  # the package a quantized folder's loader needs is missing (or too old)
        raise CheckpointError(_missing_package(path, exc)) from None
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: transformers cannot load it ({first_line(exc)})") from None
    missing = sorted(info.get("missing_keys") or []) + sorted(info.get("mismatched_keys") or [])
    if missing:  # transformers would fill them with random values and carry on
        raise CheckpointError(f"{path}: the weights lack {len(missing)} tensors the config needs "
                              f"({', '.join(map(str, missing[:3]))}); a random stand-in would be measured")
    return model.eval()


@contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _module_weight(model: nn.Module, module: nn.Module | None) -> str | None:
    names = [n for n, m in model.named_modules() if m is module and module is not None]
    return f"{names[0]}.weight" if names else None


def _check_tied_head(path: Path, config, skeleton: nn.Module) -> None:
    """A tied model (tie_word_embeddings true) whose files also store an output head different from the input
    embedding: transformers would silently use the embedding; refuse instead of measuring another model."""
    from safetensors import safe_open

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head = _module_weight(skeleton, skeleton.get_output_embeddings())
    embed = _module_weight(skeleton, skeleton.get_input_embeddings())
    if not getattr(text, "tie_word_embeddings", False) or head is None or embed is None:
        return
    stored = {}
    for file in weight_files(path):
        with safe_open(str(file), "pt") as fh:
            for name in (head, embed):
                if name in fh.keys():
                    stored[name] = fh.get_tensor(name)
    if head in stored and embed in stored and not torch.equal(stored[head], stored[embed]):
        raise CheckpointError(f"{path}: tie_word_embeddings is true but the stored {head} differs from {embed}; "
                              "set tie_word_embeddings to false to use the stored head")


HF_SIZE_KEYS = {"vocab_size": "vocab_size", "hidden_size": "d_model", "num_hidden_layers": "n_layers",
                "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads", "head_dim": "head_dim",
                "intermediate_size": "ffn_dim", "max_position_embeddings": "max_seq_len"}


def _missing_package(path: Path, exc: ImportError) -> str:
    if is_compressed_folder(path):
        return (f"{path}: transformers loads compressed-tensors folders only with the compressed-tensors package "
                "(>= 0.15), which is missing or older here: pip install 'diffquant[export]' (diffquant reads such a "
                "folder itself when --device-map is left out)")
    return f"{path}: transformers needs a package that is missing here to load it ({first_line(exc)})"


def _checked_config(path: Path):
    """The folder's transformers config, its sizes within :data:`~diffquant.config.SIZE_LIMITS`."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: transformers cannot read its config ({first_line(exc)})") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key, ours in HF_SIZE_KEYS.items():
        value = getattr(text, key, None)
        if value is not None and not (isinstance(value, int) and 0 < value <= SIZE_LIMITS[ours]):
            raise CheckpointError(f"{path}: config.json {key} must be an integer in 1..{SIZE_LIMITS[ours]}, "
                                  f"got {value!r}")
    return config


def load_for_profiling(path: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``HFProbed`` over an HF folder (profiled natively), else our checkpoint or GGUF via ``load_checkpoint``."""
    if Path(path).is_dir() and is_hf_folder(path) and not is_compressed_folder(path):  # compressed: ours
        return HFProbed(load_hf_model(path, dtype))
    return load_checkpoint(path, dtype=dtype)
