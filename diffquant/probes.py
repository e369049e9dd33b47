"""Probes: named places in the forward pass that observers read and quantizers rewrite.

A ``Probe`` is an ``nn.Identity`` that the model calls on a tensor it computes (attention logits, hidden
states, ...). Nothing is stored on the module: a forward hook sees the tensor as it flows, and a hook that
returns a tensor replaces the value flowing on. ``hooked`` attaches hooks for the duration of a ``with``
block and always removes them, also when the body raises.

Attention tensors whose last two dims are (query, key) carry a causal mask; ``Probe.causal_mask`` gives the
boolean mask of the entries that count (True = kept by the causal mask), taking the query offset of a
query-chunked forward into account.

A right-padded batch says which positions are real with ``real_lengths``: inside the block,
:func:`padding_mask` marks the positions of each row past its length (dim -2 of every probed tensor: queries,
keys or tokens), so dynamic quantizers set their scales from real tokens only and a sequence is quantized the
same alone or padded in a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn

from .attention import attention_impl, switchable
from .kinds import ATTENTION_KINDS, CAUSAL_KINDS, KINDS  # noqa: F401  (ATTENTION_KINDS: re-exported)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeCall:
    """What a hook learns besides the tensor: which queries this call covers (chunked attention)."""

    q_offset: int = 0


class Probe(nn.Identity):
    """An identity module marking a named tensor in the forward pass.

    ``kind`` is one of ``KINDS``; ``causal`` tells that the last two dims are (query, key) positions under a
    causal mask, so observers and quantizers must ignore the entries above the diagonal; ``window`` (None: no
    window) narrows that mask to the last ``window`` keys of each query, as a sliding-window attention sees them.
    """

    window: int | None = None

    def __init__(self, kind: str):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown probe kind {kind!r}")
        self.kind = kind
        self.causal = kind in CAUSAL_KINDS

    def forward(self, x: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
        return x

    def causal_mask(self, x: torch.Tensor, q_offset: int = 0) -> torch.Tensor | None:
        """Boolean mask broadcastable to ``x`` (True = counts), or None for tensors without a causal mask."""
        if not self.causal:
            return None
        t, s = x.shape[-2], x.shape[-1]
        q_pos = torch.arange(q_offset, q_offset + t, device=x.device)[:, None]
        k_pos = torch.arange(s, device=x.device)[None, :]
        keep = k_pos <= q_pos
        if self.window is not None:
            keep = keep & (k_pos > q_pos - self.window)  # HF's sliding_window_overlay
        return keep.view((1,) * (x.ndim - 2) + (t, s))

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


def probes(model: nn.Module, kinds: str | tuple[str, ...] | None = None) -> dict[str, Probe]:
    """All probes of ``model`` by qualified name, e.g. ``layers.0.attn.logits``, optionally of some kinds."""
    if isinstance(kinds, str):
        kinds = (kinds,)
    return {
        name: mod for name, mod in model.named_modules()
        if isinstance(mod, Probe) and (kinds is None or mod.kind in kinds)
    }


# Real tokens per row of the batch the running forward reads (None: every position is real).
_REAL_LENGTHS: ContextVar[tuple[int, ...] | None] = ContextVar("diffquant_real_lengths", default=None)


@contextmanager
def real_lengths(lengths: Sequence[int]) -> Iterator[None]:
    """Inside the block, row b of the (right-padded) batch a forward reads holds ``lengths[b]`` real tokens."""
    lengths = tuple(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise ValueError(f"real lengths must be positive, one per row, got {lengths}")
    token = _REAL_LENGTHS.set(lengths)
    try:
        yield
    finally:
        _REAL_LENGTHS.reset(token)


def padding_mask(x: torch.Tensor, q_offset: int = 0) -> torch.Tensor | None:
    """Bool mask broadcastable to ``x`` [B, ..., T, F] (True = a real token at dim -2, whose positions start at
    ``q_offset``) inside :func:`real_lengths`; None outside it or when no row is padded within ``x``."""
    lengths = _REAL_LENGTHS.get()
    if lengths is None or x.ndim < 3:  # a 2-d tensor has no position dim: (B, F) rows are whole tokens
        return None
    if x.shape[0] != len(lengths):
        raise ValueError(f"a tensor of batch {x.shape[0]} inside real_lengths() for {len(lengths)} rows")
    t = x.shape[-2]
    if min(lengths) >= q_offset + t:
        return None
    pos = torch.arange(q_offset, q_offset + t, device=x.device)
    keep = pos[None, :] < torch.tensor(lengths, device=x.device)[:, None]  # (B, T)
    return keep.view((len(lengths),) + (1,) * (x.ndim - 3) + (t, 1))


# hook(name, probe, tensor, call) -> None to observe, or a tensor to replace the value flowing on.
ProbeHook = Callable[[str, Probe, torch.Tensor, ProbeCall], "torch.Tensor | None"]


@contextmanager
def hooked(
    model: nn.Module, hook: ProbeHook, kinds: str | tuple[str, ...] | None = None,
    select: Callable[[str, Probe], bool] | None = None,
) -> Iterator[dict[str, Probe]]:
    """Attach ``hook`` to the selected probes for the duration of the block; always detach it.

    Attention maps (logits, probabilities, Diff's map, clipped probabilities) exist only on the eager path: when
    such probes are chosen on a model running fused attention (sdpa / flash), its attention modules run eager
    inside the block (same outputs; their query-chunk setting kept) and are switched back after it; a model
    whose config says fused attention but has no switchable modules gets a warning.
    """
    chosen = {n: p for n, p in probes(model, kinds).items() if select is None or select(n, p)}
    handles = []
    with _eager_for_maps(model, chosen):
        try:
            for name, probe in chosen.items():
                handles.append(probe.register_forward_hook(_adapt(name, hook), with_kwargs=True))
            yield chosen
        finally:
            for handle in handles:
                handle.remove()


def _eager_for_maps(model: nn.Module, chosen: dict[str, Probe]):
    """Eager attention (query chunks kept) while attention maps are probed (:func:`attention_impl`), else
    nothing."""
    if not any(p.kind in CAUSAL_KINDS for p in chosen.values()):
        return nullcontext()
    modules = switchable(model)
    fused = [m.impl for m in modules if m.impl != "eager"]
    impl = getattr(getattr(model, "config", None), "attn_impl", "eager")
    if not modules and impl != "eager":  # (modules already switched to eager, e.g. by profile, are fine)
        log.warning("attention-map probes never fire on %s attention; run the model with eager attention", impl)
    if fused:
        log.info("attention maps exist only on the eager path: running eager (not %s) inside hooked()", fused[0])
    return attention_impl(model, "eager")


def _adapt(name: str, hook: ProbeHook):
    def forward_hook(module, args, kwargs, output):
        q_offset = kwargs.get("q_offset", args[1] if len(args) > 1 else 0)
        return hook(name, module, output, ProbeCall(q_offset=q_offset))

    return forward_hook
