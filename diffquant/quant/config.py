"""What to quantize and how: small frozen dataclasses with JSON round-trip and one-line validation errors.

``QuantConfig`` composes one ``WeightQuant`` (the Linear weights of the blocks) with ``ActQuant`` settings for
the dynamic quantizers at probes and Linear inputs::

    QuantConfig(weights=WeightQuant("gptq", bits=4, group_size=128),
                logits=ActQuant(bits=4, granularity="sequence"),   # the paper's experiment
                activations=ActQuant(bits=8, granularity="token")) # W4A8

Activation granularities (scales are always per sequence at least, so results never depend on batch size):

* ``"sequence"``: one scale per sequence (batch element) per probe call;
* ``"head"``: per sequence and head (attention probes only; both maps of a Diff head share the scale);
* ``"head_map"``: per sequence, head and Diff map (the same as ``"head"`` for every other tensor), since one
  nearly unused map can set a shared step size;
* ``"row"`` / ``"token"``: per query row of an attention map / per token of a hidden vector (all dims but the
  last); the two names mean the same reduction.

``ActQuant(bits=16)`` means *unquantized* (the paper's 16-bit point of a sweep); to really round to int16 set
``unquantized_at_16=False``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from ..io import JsonConfig, read_json_file
from ..kinds import (
    ACT_GRANULARITIES,
    ATTENTION_KINDS,
    ATTN_K,
    ATTN_LOGITS,
    ATTN_PROBS,
    ATTN_Q,
    HEAD_GRANULARITIES,
    HIDDEN,
    PER_SEQUENCE_GRANULARITIES,  # noqa: F401  (re-exported)
    SEQUENCE,
    canonical_granularity,
    upgrade_legacy_granularities,
)
from .registry import weight_method, weight_methods

__all__ = ["ACT_GRANULARITIES", "ACT_TARGETS", "HEAD_GRANULARITIES", "PROBE_TARGETS", "ActQuant", "QuantConfig",
           "WeightQuant"]

# QuantConfig field -> probe kinds it quantizes (``activations`` = the inputs of the selected Linear layers).
PROBE_TARGETS: dict[str, tuple[str, ...]] = {
    "logits": (ATTN_LOGITS,),
    "probs": (ATTN_PROBS,),
    "qk": (ATTN_Q, ATTN_K),
    "hidden": (HIDDEN,),
}
# The one name of each activation target (sweep targets, records, reports) -> the QuantConfig field it sets:
# the probe kind when the field quantizes one kind ("attn_logits" -> logits), else the field's name ("qk").
ACT_TARGETS: dict[str, str] = {
    **{kinds[0] if len(kinds) == 1 else field: field for field, kinds in PROBE_TARGETS.items()},
    "linear_inputs": "activations"}
# Fields that need eager attention: fused kernels never show these tensors.
ATTENTION_FIELDS = tuple(f for f, kinds in PROBE_TARGETS.items() if set(kinds) <= set(ATTENTION_KINDS))


def __getattr__(name: str):
    """``WEIGHT_METHODS`` (the registered method names) and ``BNB_BITS``, read from the registry when asked."""
    if name == "WEIGHT_METHODS":
        return weight_methods()
    if name == "BNB_BITS":
        return {m: weight_method(m).fixed_bits for m in weight_methods() if weight_method(m).fixed_bits}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class _PlainFields:
    """``to_dict`` / ``from_dict`` of a dataclass whose fields are plain JSON values; unknown fields are refused."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object):
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class WeightQuant(_PlainFields):
    """Weight quantization of Linear layers.

    method: a registered weight method (:mod:`diffquant.quant.registry`): "rtn" (round to nearest), "gptq"
        (needs calibration data), "bnb-int8" (LLM.int8 with outlier ``threshold``), "bnb-nf4", "bnb-fp4"
        (bitsandbytes; optional extra ``diffquant[bnb]``), "hadamard-rtn" (RTN of the Hadamard-rotated weight).
    bits: 2..8 for rtn/gptq (codes of ≤ 4 bits are packed two per byte); implied by the bnb methods.
    group_size: None = one scale per output channel; else one per group of that many contiguous input columns
        (where it does not divide the input width, the last group of each row is shorter).
    symmetric: absmax (codes ±(2**(bits-1)-1)) or asymmetric min/max with a zero point.
    grid: symmetric grid of rtn/gptq Linear weights: "absmax" (codes ±(2**(bits-1)-1), the contract) or "full"
        (GPTQ's: all 2**bits levels, scale 2·amax/(2**bits-1), zero point 2**(bits-1)); embeddings keep absmax.
        None: "full" for symmetric gptq (as GPTQ and GPTQModel; 0.09 lower perplexity on stories260K at 4 bits,
        experiments/results/perf.md), else "absmax".
    act_order, damp, block_size, sequential: GPTQ options (columns by decreasing Hessian diagonal; damping as a
        fraction of the mean diagonal; lazy-batch width; each stage of a block calibrated on the outputs of its
        already quantized stages, else all from one forward of the block).
    embeddings: also quantize the token embedding and output head (RTN per row; a tied pair shares its codes).
    """

    method: str = "rtn"
    bits: int | None = None
    group_size: int | None = None
    symmetric: bool = True
    act_order: bool = False
    damp: float = 0.01
    block_size: int = 128
    grid: str | None = None
    sequential: bool = True
    threshold: float = 6.0
    embeddings: bool = False

    def __post_init__(self) -> None:
        method = weight_method(self.method)
        if self.grid is None:  # resolved here, so to_dict() and quant.json say which grid was used
            object.__setattr__(self, "grid", method.default_grid(self))
        method.check(self)  # resolves bits a method implies, refuses settings it takes none of
        if not _is_int(self.bits) or not 2 <= self.bits <= 8:
            raise ValueError(f"weight bits must be an integer in 2..8, got {self.bits!r} "
                             "(16-bit weights: leave weights=None)")
        if self.group_size is not None and (not _is_int(self.group_size) or self.group_size < 1):
            raise ValueError(f"group_size must be a positive integer or None, got {self.group_size!r}")
        if not isinstance(self.damp, numbers.Real) or not 0 < self.damp < 1:
            raise ValueError(f"damp must lie in (0, 1), got {self.damp!r}")
        if not _is_int(self.block_size) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.grid not in ("absmax", "full") or (self.grid == "full" and not self.symmetric):
            raise ValueError(f"grid must be 'absmax' or 'full' (symmetric only), got {self.grid!r}")
        for name in ("symmetric", "act_order", "embeddings", "sequential"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, numbers.Real) \
                or not 0 <= self.threshold < math.inf:
            raise ValueError(f"threshold must be a finite non-negative number, got {self.threshold!r}")

    @property
    def handler(self):
        """The registered :class:`~diffquant.quant.registry.WeightMethod` of ``method``."""
        return weight_method(self.method)

    @property
    def is_bnb(self) -> bool:
        """A method with its own activation handling (bitsandbytes); kept for callers of the old name."""
        return not self.handler.takes_input_quant


@dataclass(frozen=True)
class ActQuant(_PlainFields):
    """Dynamic (per forward) integer quantization of an activation: absmax (or min/max) per slice.

    bits: 2..16; 16 means unquantized (the paper's convention) unless ``unquantized_at_16=False``.
    granularity: "sequence", "head" (per sequence and head), "head_map" (per sequence, head and Diff map),
        "row" / "token" (per vector).
    """

    bits: int = 8
    granularity: str = SEQUENCE
    symmetric: bool = True
    unquantized_at_16: bool = True

    def __post_init__(self) -> None:
        if not _is_int(self.bits) or not 2 <= self.bits <= 16:
            raise ValueError(f"bits must be an integer in 2..16 (16: unquantized), got {self.bits!r}")
        object.__setattr__(self, "granularity", canonical_granularity(self.granularity))  # frozen: set once, here
        if self.granularity not in ACT_GRANULARITIES:
            raise ValueError(f"unknown activation granularity {self.granularity!r}; "
                             f"expected one of {', '.join(ACT_GRANULARITIES)}")

    @property
    def is_noop(self) -> bool:
        """True for the unquantized 16-bit point of a sweep."""
        return self.bits == 16 and self.unquantized_at_16


@dataclass(frozen=True)
class QuantConfig(JsonConfig):
    """Weights + dynamic quantizers at probes (logits, probs, qk, hidden) + Linear inputs (activations)."""

    weights: WeightQuant | None = None
    logits: ActQuant | None = None
    probs: ActQuant | None = None
    qk: ActQuant | None = None
    hidden: ActQuant | None = None
    activations: ActQuant | None = None

    def __post_init__(self) -> None:
        if self.weights is not None and not isinstance(self.weights, WeightQuant):
            raise ValueError(f"weights must be a WeightQuant or None, got {type(self.weights).__name__}")
        for name in (*PROBE_TARGETS, "activations"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, ActQuant):
                raise ValueError(f"{name} must be an ActQuant or None, got {type(value).__name__}")
        for name in ("hidden", "activations"):
            value = getattr(self, name)
            if value is not None and value.granularity in HEAD_GRANULARITIES:
                raise ValueError(f"granularity {value.granularity!r} applies to attention probes only, not to {name}")
        if self.activations is not None and self.weights is not None and not self.weights.handler.takes_input_quant:
            raise ValueError(f"{self.weights.method} brings its own activation handling; drop activations")

    def to_dict(self) -> dict:
        return {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to_dict())
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "QuantConfig":
        if not isinstance(data, dict):
            raise ValueError(f"QuantConfig must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown QuantConfig fields: {', '.join(unknown)}")
        parts = {}
        for name, value in data.items():
            part = WeightQuant if name == "weights" else ActQuant
            parts[name] = None if value is None else part.from_dict(value)
        return cls(**parts)

    @classmethod
    def from_json_file(cls, path) -> "QuantConfig":
        """A QuantConfig file, also one written before an activation granularity was renamed."""
        return cls.from_dict(upgrade_legacy_granularities(read_json_file(path)))

    def probe_targets(self) -> dict[str, ActQuant]:
        """Probe kind -> its (non-no-op) quantizer."""
        out = {}
        for name, kinds in PROBE_TARGETS.items():
            act = getattr(self, name)
            if act is not None and not act.is_noop:
                out.update(dict.fromkeys(kinds, act))
        return out

    @property
    def needs_eager(self) -> bool:
        return any(getattr(self, f) is not None and not getattr(self, f).is_noop for f in ATTENTION_FIELDS)
