"""Weight methods as registered handlers (torchao's config -> handler registry, gpt-fast's per-scheme handler).

One module per method under ``diffquant/quant/methods/`` subclasses :class:`WeightMethod` and calls
:func:`register`; everything else (``WeightQuant`` validation, ``quantize_``, packed checkpoints, exports, sweeps,
the lm-eval adapter, ``diffquant quantize``) asks the registry instead of testing method names. A handler says:

* ``name`` and ``needs_calibration`` (calibration token ids must reach ``quantize_``);
* how it checks its ``WeightQuant`` settings (:meth:`WeightMethod.check`) and a model (:meth:`check_model`);
* how it quantizes the selected Linear layers (:meth:`quantize_`);
* how its modules pack and unpack: the quant.json ``type`` names it owns, :meth:`scheme` and
  :meth:`empty_module`;
* which export formats it supports (:data:`EXPORT_FORMATS`); :func:`refuse_export` words the refusal.

This module imports nothing from the package: ``quant/config.py`` validates through it, and the handlers,
which build on ``quant/linear.py`` (and so on the config), register themselves when ``diffquant.quant`` is
imported (``diffquant/quant/__init__.py`` imports ``diffquant.quant.methods`` first).
"""

from __future__ import annotations

__all__ = ["COMPRESSED_TENSORS", "EXPORT_FORMATS", "GGUF", "HF_DEQUANTIZED", "WeightMethod", "method_for_module",
           "method_for_type", "refuse_export", "register", "weight_method", "weight_methods"]

GGUF, COMPRESSED_TENSORS, HF_DEQUANTIZED = "gguf", "compressed-tensors", "hf-dequantized"
EXPORT_FORMATS = (GGUF, COMPRESSED_TENSORS, HF_DEQUANTIZED)  # besides diffquant's own packed checkpoint


class WeightMethod:
    """The handler of one weight method; subclasses override what differs from these defaults."""

    name: str = ""
    label: str = ""  # how messages name it ("GPTQ"); the name when empty
    needs_calibration: bool = False
    exports: frozenset[str] = frozenset()
    module_types: tuple[str, ...] = ()  # quant.json "type"s of the modules it installs and restores
    fixed_bits: int | None = None  # the bit width the method implies (bitsandbytes); None: bits 2..8 required
    sweepable: bool = True  # a sweep target "weights-<name>" over bit widths
    takes_input_quant: bool = True  # combinable with QuantConfig(activations=...)
    keeps_float_dtype: bool = False  # its float statistics are part of its format: never cast when saving
    loads_extra_keys: bool = False  # restored modules consume state-dict keys beyond their own parameters

    @property
    def title(self) -> str:
        return self.label or self.name

    def default_grid(self, wq) -> str:
        """The symmetric grid when ``WeightQuant(grid=None)``."""
        return "absmax"

    def check(self, wq) -> None:
        """Method-specific checks of a ``WeightQuant`` (bits resolved or refused); ValueError with one line."""

    def check_model(self, wq, linears: list[str], embeddings: list[str], batches: list) -> None:
        """Refusals that need the selection or the calibration data, before the model is touched."""
        if self.needs_calibration and not batches:
            raise ValueError(f"{self.title} needs calibration data: pass calib=token ids [N, T]")

    def quantize_(self, model, names: list[str], wq, batches: list) -> None:
        """Replace the ``nn.Linear`` modules ``names`` of ``model`` by quantized ones."""
        raise NotImplementedError

    def owns(self, module) -> bool:
        """Whether ``module`` is one this method installs (and :meth:`scheme` describes)."""
        describe = getattr(module, "scheme", None)
        return callable(describe) and describe().get("type") in self.module_types

    def scheme(self, module) -> dict:
        """What quant.json records for one of its modules."""
        return module.scheme()

    def empty_module(self, old, scheme: dict, tensors: dict, name: str):
        """A module of ``scheme["type"]`` ready to load its saved tensors (``old``: the float module there)."""
        raise NotImplementedError


_METHODS: dict[str, WeightMethod] = {}


def register(method: WeightMethod) -> WeightMethod:
    """Add a handler; a name or module type already taken is a programming error."""
    if not method.name or method.name in _METHODS:
        raise ValueError(f"weight method name {method.name!r} is empty or already registered")
    taken = {t for m in _METHODS.values() for t in m.module_types} & set(method.module_types)
    if taken:
        raise ValueError(f"module types {sorted(taken)} already belong to another weight method")
    if set(method.exports) - set(EXPORT_FORMATS):
        raise ValueError(f"unknown export formats {sorted(set(method.exports) - set(EXPORT_FORMATS))}")
    _METHODS[method.name] = method
    return method


def weight_methods() -> tuple[str, ...]:
    """The registered method names, in registration order."""
    return tuple(_METHODS)


def weight_method(name: str) -> WeightMethod:
    try:
        return _METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown weight method {name!r}; expected one of {', '.join(_METHODS)}") from None


def method_for_type(module_type: str) -> WeightMethod | None:
    """The handler owning a quant.json module type (None: not a weight module)."""
    return next((m for m in _METHODS.values() if module_type in m.module_types), None)


def method_for_module(module) -> WeightMethod | None:
    """The handler that installed ``module`` (None: not a weight module of any method)."""
    return next((m for m in _METHODS.values() if m.owns(module)), None)


def refuse_export(method: WeightMethod, fmt: str, where: str) -> str | None:
    """The one-line refusal when ``method`` cannot be exported as ``fmt`` (None when it can)."""
    if fmt.lower() in method.exports:
        return None
    others = ", ".join(sorted(method.exports)) or "none besides diffquant's packed checkpoint"
    return f"{fmt} export cannot carry {method.title} weights ({where}); its export formats: {others}"
