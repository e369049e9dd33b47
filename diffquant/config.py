"""Model configuration: one frozen dataclass shared by every attention design (arch) the study compares.

For ``arch="diff"``, ``n_heads`` counts differential heads: each has two query/key sub-heads of ``head_dim``
and a value of ``2 * head_dim``, so a Diff model with ``n_heads = H/2`` has exactly the projection shapes of
a Transformer with ``H`` heads of the same ``head_dim`` (the paper's parameter matching).
``arch="gated"`` (Qiu et al. 2025) adds a d_model × q_dim gate projection per layer and pays for it with a
narrower SwiGLU (``gate_ffn_cut``); ``arch="clipped"`` (Bondarenko et al. 2023) has no extra parameters.
The arches and their matching rules are rows of :mod:`diffquant.arches`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .arches import arch_names, arch_spec, gate_ffn_cut  # noqa: F401  (gate_ffn_cut re-exported)
from .io import JsonConfig

ATTN_IMPLS = ("eager", "sdpa", "flash", "triton")  # triton: see diffquant.attention
# Sanity limits checked before anything is allocated (far above any model this toolkit is meant for).
SIZE_LIMITS = {"vocab_size": 1 << 21, "d_model": 1 << 16, "n_layers": 1024, "n_heads": 1024, "n_kv_heads": 1024,
               "head_dim": 1 << 12, "ffn_dim": 1 << 18, "max_seq_len": 1 << 21}


def default_ffn_dim(d_model: int) -> int:
    """SwiGLU hidden size ≈ 8/3·d_model, rounded to the nearest multiple of 64 (LLaMA layout)."""
    return max(64, 64 * round(8 * d_model / 3 / 64))


def __getattr__(name: str):
    """``ARCHS``: the arch names of :mod:`diffquant.arches`' table, read when asked."""
    if name == "ARCHS":
        return arch_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lambda_init_for_layer(layer: int) -> float:
    """The paper's λ_init schedule, with ``layer`` the 0-based layer index."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


@dataclass(frozen=True)
class ModelConfig(JsonConfig):
    arch: str = "transformer"
    vocab_size: int = 8192
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    # Given as None they are resolved at construction (as HF configs do), so they always hold concrete ints:
    n_kv_heads: int | None = None  # grouped-query attention; None: n_heads
    head_dim: int | None = None  # None: d_model // n_heads (// 2 more for diff)
    ffn_dim: int | None = None  # None: default_ffn_dim(d_model)
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    attn_impl: str = "eager"
    lambda_init: float | None = None  # Diff only: None = the paper's per-layer schedule; a number = that constant

    def __post_init__(self):
        _check_types(self)
        arch_spec(self.arch)  # a known arch, else ValueError
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"unknown attn_impl {self.attn_impl!r}; expected one of {', '.join(ATTN_IMPLS)}")
        for name, limit in SIZE_LIMITS.items():
            if getattr(self, name) is not None:
                _require_positive(name, getattr(self, name), limit)
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ValueError("rope_theta and norm_eps must be positive")
        if self.lambda_init is not None and not (isinstance(self.lambda_init, (int, float))
                                                 and math.isfinite(self.lambda_init)):
            raise ValueError(f"lambda_init must be a finite number or null, got {self.lambda_init!r}")
        self._resolve_sizes()
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")

    def _resolve_sizes(self) -> None:
        """Fill the sizes left as None with their defaults (a frozen dataclass: set once, here)."""
        sub = self.sub_heads_per_head
        if self.head_dim is None:
            if self.d_model % (self.n_heads * sub):
                raise ValueError(
                    f"d_model {self.d_model} is not divisible by {self.n_heads * sub} "
                    f"({self.n_heads} heads x {sub} sub-heads); set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.d_model // (self.n_heads * sub))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", default_ffn_dim(self.d_model))

    # Derived sizes (properties so they never disagree with the stored fields).
    @property
    def sub_heads_per_head(self) -> int:
        return arch_spec(self.arch).sub_heads

    def lambda_init_at(self, layer: int) -> float:
        """λ_init of 0-based ``layer``: the schedule, or the constant of the Table-6 ablation."""
        return lambda_init_for_layer(layer) if self.lambda_init is None else float(self.lambda_init)

    @property
    def q_dim(self) -> int:
        """Width of q_proj's output (= v_proj and out_proj width for n_kv_heads == n_heads)."""
        return self.n_heads * self.sub_heads_per_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.sub_heads_per_head * self.head_dim

    def matched(self, arch: str) -> ModelConfig:
        """The parameter-matched partner of another arch, by the arch table's rules (:mod:`diffquant.arches`):
        Diff has half the Transformer's heads at the same head_dim; gated trades its gate's parameters for FFN
        width (within 1%); clipped changes nothing."""
        target = arch_spec(arch)
        if arch == self.arch:
            return self
        transformer = dataclasses.replace(self, arch="transformer", **arch_spec(self.arch).to_transformer(self))
        return dataclasses.replace(transformer, arch=arch, **target.from_transformer(transformer))

    # JSON round trip.
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields: {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def preset(cls, name: str, arch: str = "transformer", **overrides) -> ModelConfig:
        """Presets are defined for the Transformer; the Diff preset is its matched partner."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
        base = cls(arch="transformer", **PRESETS[name])
        cfg = base.matched(arch)
        return dataclasses.replace(cfg, **overrides) if overrides else cfg


def _require_positive(name: str, value, limit: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= limit:
        raise ValueError(f"{name} must be a positive integer (at most {limit}), got {value!r}")


def _check_types(cfg: ModelConfig) -> None:
    """Strict JSON types for the fields annotated bool, int, float or str (optionally ``| None``): no "no" for a
    bool, no true for an int, no NaN or Infinity for a float."""
    for field in dataclasses.fields(cfg):
        value, (kind, *rest) = getattr(cfg, field.name), str(field.type).split(" | ")
        if (value is None and "None" in rest) or kind not in _CHECKS:
            continue
        if not _CHECKS[kind](value):
            raise ValueError(f"{field.name} must be {kind}, got {value!r}")


_CHECKS = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "str": lambda v: isinstance(v, str),
}


# Transformer presets; the Diff partner halves n_heads (and n_kv_heads) at the same head_dim.
PRESETS: dict[str, dict] = {
    # unit tests: tiny and fast
    "tiny": dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=128),
    # the CPU pair: ≈ 5.3M parameters (2.1M of them in the tied embedding), context 256
    "small": dict(vocab_size=8192, d_model=256, n_layers=4, n_heads=8, max_seq_len=256),
    # the GPU pair: ≈ 119M parameters, context 1024
    "base": dict(vocab_size=8192, d_model=768, n_layers=16, n_heads=12, max_seq_len=1024),
    # the outlier regime, stories260K's shape (llama2.c doc/stories260K.md): ≈ 260K parameters, its 512-token
    # SentencePiece vocabulary and 512-token context, SwiGLU width 172 as in that model
    "xs": dict(vocab_size=512, d_model=64, n_layers=5, n_heads=8, n_kv_heads=4, ffn_dim=172, max_seq_len=512),
    # twice as wide, deeper (λ_init reaches 0.73 at layer 7): ≈ 1.5M parameters, same vocabulary and context
    "s": dict(vocab_size=512, d_model=128, n_layers=8, n_heads=8, max_seq_len=512),
    # the size ladder above s (issue 37), same vocabulary and context, head_dim 64, SwiGLU 8/3·d_model, Diff's
    # λ_init by depth as the paper (0.2 at layer 0 … 0.73 at layer 7 … 0.78 at layer 11):
    # m ≈ 14.4M parameters, 8 layers
    "m": dict(vocab_size=512, d_model=384, n_layers=8, n_heads=6, max_seq_len=512),
    # l ≈ 85.3M parameters, 12 layers (GPT-2 small's width and depth)
    "l": dict(vocab_size=512, d_model=768, n_layers=12, n_heads=12, max_seq_len=512),
}
