"""Switching the attention implementation of a model's attention modules: the one place that knows how.

An attention module is *switchable* when it carries ``impl`` (``"eager"``, ``"sdpa"`` or ``"flash"``: which
kernel its forward runs) and ``chunk`` (eager only: the query-chunk size, None = all queries at once), as
:class:`diffquant.model.Attention` does. Profiling and probing attention maps run eager for a while, GPTQ
calibrates with sdpa; each does so through :func:`attention_impl`, which restores every module on exit (also on
exceptions). The model's config is left as it is: it says how the model runs outside the block.

Diff attention may instead run the fused Triton forward (:mod:`diffquant.kernels.diff_attention`: both maps, λ
and the head norm in one kernel): with ``impl="triton"`` wherever Triton runs it (CUDA; the CPU only under
``TRITON_INTERPRET=1``), and with ``impl="sdpa"`` automatically on CUDA (:func:`auto_diff_kernel` turns that
off). :func:`diff_kernel_applies` decides per call; everywhere else the sdpa path runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["KEEP", "attention_impl", "auto_diff_kernel", "diff_kernel_applies", "diff_kernel_wanted",
           "set_attention_", "switchable"]

KEEP = object()  # leave each module's chunk as it is


def switchable(model: nn.Module) -> list[nn.Module]:
    """The attention modules of ``model`` that carry ``impl`` and ``chunk``."""
    return [m for m in model.modules() if hasattr(m, "impl") and hasattr(m, "chunk")]


def set_attention_(modules: list[nn.Module], impl: str, chunk=KEEP) -> None:
    """Set ``impl`` (and ``chunk`` unless KEEP) on each of ``modules``, in place."""
    for m in modules:
        m.impl = impl
        if chunk is not KEEP:
            m.chunk = chunk


@contextlib.contextmanager
def attention_impl(model: nn.Module, impl: str, chunk=KEEP) -> Iterator[list[tuple[nn.Module, str, int | None]]]:
    """Run every switchable attention module of ``model`` with ``impl`` (and ``chunk``) inside the block; yields
    (module, impl, chunk) as they were, which are restored on exit."""
    saved = [(m, m.impl, m.chunk) for m in switchable(model)]
    set_attention_([m for m, _, _ in saved], impl, chunk)
    try:
        yield saved
    finally:
        for m, old_impl, old_chunk in saved:
            m.impl, m.chunk = old_impl, old_chunk


_AUTO = {"diff_kernel": True}  # "sdpa" on CUDA takes the fused Diff kernel (auto_diff_kernel switches it)


@contextlib.contextmanager
def auto_diff_kernel(enabled: bool) -> Iterator[None]:
    """Inside the block, ``impl="sdpa"`` takes the fused Diff kernel on CUDA only when ``enabled`` (e.g. False to
    time torch's sdpa alone); restored on exit."""
    saved = _AUTO["diff_kernel"]
    _AUTO["diff_kernel"] = enabled
    try:
        yield
    finally:
        _AUTO["diff_kernel"] = saved


def diff_kernel_wanted(impl: str, device_type: str, auto: bool = True) -> bool:
    """Whether ``impl`` asks for the fused Diff kernel on this kind of device: "triton" anywhere (the CPU needs the
    interpreter, which :func:`diff_kernel_applies` checks), "sdpa" on CUDA when ``auto``; never "eager" (the
    observable path) or "flash"."""
    if impl == "triton":
        return device_type in ("cuda", "cpu")
    return impl == "sdpa" and auto and device_type == "cuda"


def diff_kernel_applies(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *params: torch.Tensor) -> bool:
    """Whether one Diff attention call (rotated ``q`` (B, 2H, T, d), ``k`` (B, 2K, S, d), ``v`` (B, K, S, 2d) and the
    layer's λ / norm ``params``) runs the fused kernel: :func:`diff_kernel_wanted`, no gradient needed (the kernel
    is forward only), not inside ``torch.compile``, Triton importable, inputs the kernel takes, and its one-time
    self-check passed on this device, dtype and head width."""
    if not diff_kernel_wanted(impl, q.device.type, _AUTO["diff_kernel"]) or torch.compiler.is_compiling():
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *params)):
        return False
    from .kernels import available

    if not available():
        return False
    from .kernels import diff_attention

    return diff_attention.supports(q, k, v) and diff_attention.self_check(q.device, q.dtype, q.shape[-1])
