"""The attention designs (arches) the study compares, one row each: everything else reads this table (pure).

A row says how the arch's attention is built (:class:`Attention` flags in ``model.py``: query/key sub-heads, the
differential map, the output gate, the clipped softmax, whether a fused kernel computes it), which probes it adds
beyond every arch's own, how it is drawn and named (colour, line style, label, one-letter short name), and its
parameter-matching rule against the Transformer (the config changes that make it the Transformer, and back).
Adding an arch is adding a row with :func:`register_arch`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Callable

from .kinds import ATTN_CLIPPED, ATTN_DIFF, ATTN_GATE

__all__ = ["ARCHES", "Arch", "ArchColumn", "PROBE_NAMES", "arch_names", "arch_spec", "gate_ffn_cut", "register_arch",
           "unregister_arch"]

Overrides = Callable[[object], dict]  # a ModelConfig -> the fields that change


def _same(cfg) -> dict:
    return {}


@dataclass(frozen=True)
class Arch:
    name: str
    label: str  # tables and legends: "Diff"
    short: str  # one letter in dense tables: "D"
    color: str  # matplotlib colour
    linestyle: str = "-"
    sub_heads: int = 1  # query/key sub-heads per head (Diff: 2, its value is 2·head_dim wide)
    differential: bool = False  # softmax(Q1K1ᵀ) − λ·softmax(Q2K2ᵀ), λ parameters and the head norm
    gated: bool = False  # a sigmoid output gate per head (gate_proj)
    clipped: bool = False  # clipped softmax
    fused: bool = True  # sdpa / flash can compute it (the clipped softmax has no fused kernel)
    probes: dict[str, str] = field(default_factory=dict)  # probe kinds it adds -> their display names
    to_transformer: Overrides = _same  # the matched Transformer's config changes
    from_transformer: Overrides = _same  # the changes that turn the matched Transformer into this arch


def gate_ffn_cut(cfg) -> int:
    """SwiGLU width the gated arm gives up: its gate has d_model·q_dim weights, each FFN unit 3·d_model."""
    return round(cfg.q_dim / 3)


def _diff_from_transformer(cfg) -> dict:
    if cfg.n_heads % 2 or cfg.n_kv_heads % 2:
        raise ValueError(
            f"a Diff partner needs an even number of heads and kv heads, got {cfg.n_heads}/{cfg.n_kv_heads}")
    # head_dim stays: the defaults agree, d_model // (H·s) is the same for both
    return {"n_heads": cfg.n_heads // 2, "n_kv_heads": cfg.n_kv_heads // 2}


ARCHES: dict[str, Arch] = {}


def register_arch(arch: Arch) -> Arch:
    if arch.name in ARCHES:
        raise ValueError(f"arch {arch.name!r} is already registered")
    ARCHES[arch.name] = arch
    return arch


def unregister_arch(name: str) -> None:
    """Remove an arch added by :func:`register_arch` (tests add and remove their own)."""
    ARCHES.pop(name, None)


class ArchColumn(Mapping):
    """One column of the table as a read-only mapping arch name -> value, read live (a row added later shows)."""

    def __init__(self, column: str):
        self.column = column

    def __getitem__(self, name: str):
        if name not in ARCHES:
            raise KeyError(name)
        return getattr(ARCHES[name], self.column)

    def __iter__(self) -> Iterator[str]:
        return iter(list(ARCHES))

    def __len__(self) -> int:
        return len(ARCHES)


class _ProbeNames(Mapping):
    """Probe kind -> display name, over the probes every arch adds (read live)."""

    def _merged(self) -> dict[str, str]:
        return {kind: label for arch in ARCHES.values() for kind, label in arch.probes.items()}

    def __getitem__(self, kind: str) -> str:
        return self._merged()[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())


PROBE_NAMES = _ProbeNames()


def arch_names() -> tuple[str, ...]:
    return tuple(ARCHES)


def arch_spec(name: str) -> Arch:
    try:
        return ARCHES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown arch {name!r}; expected one of {', '.join(ARCHES)}") from None


register_arch(Arch("transformer", "Transformer", "T", "tab:blue", "-"))
register_arch(Arch(
    "diff", "Diff", "D", "tab:red", "--", sub_heads=2, differential=True, probes={ATTN_DIFF: "diff map"},
    # λ_init is Diff-only: a constant-λ ablation's partner is the plain Transformer
    to_transformer=lambda c: {"n_heads": c.n_heads * 2, "n_kv_heads": c.n_kv_heads * 2, "lambda_init": None},
    from_transformer=_diff_from_transformer))
register_arch(Arch(
    "gated", "Gated", "G", "tab:green", "-.", gated=True, probes={ATTN_GATE: "attention gate"},
    to_transformer=lambda c: {"ffn_dim": c.ffn_dim + gate_ffn_cut(c)},
    from_transformer=lambda c: {"ffn_dim": c.ffn_dim - gate_ffn_cut(c)}))
register_arch(Arch("clipped", "Clipped", "C", "tab:purple", ":", clipped=True, fused=False,
                   probes={ATTN_CLIPPED: "clipped probs"}))
