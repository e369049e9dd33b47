"""Switching the attention implementation of a model's attention modules: the one place that knows how.

An attention module is *switchable* when it carries ``impl`` (``"eager"``, ``"sdpa"`` or ``"flash"``: which
kernel its forward runs) and ``chunk`` (eager only: the query-chunk size, None = all queries at once), as
:class:`diffquant.model.Attention` does. Profiling and probing attention maps run eager for a while, GPTQ
calibrates with sdpa; each does so through :func:`attention_impl`, which restores every module on exit (also on
exceptions). The model's config is left as it is: it says how the model runs outside the block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["KEEP", "attention_impl", "set_attention_", "switchable"]

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
