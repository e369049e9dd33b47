"""The one validation of a packed folder's contents, used by every reader (load, info, convert, sweep).

Two stages, both before anything is trusted:

* :func:`check_schemes`: each module scheme of ``quant.json`` against the float skeleton it replaces — known
  type, integer bits in the quantizer's range, a positive group size (the last group of a row may be shorter), booleans
  where booleans go, and the skeleton's own shape (so a declared 10^9 x 10^9 Linear is refused before any
  buffer is allocated);
* :func:`check_codes`: the stored tensors — every code inside its bit width's range (a 3-bit code 12 would
  otherwise be read or exported wrapped), zero points inside ``0..2**bits-1``, scales finite and non-negative,
  and a zero scale only over a group whose codes are all at its zero point (what the quantizers write for an
  all-zero slice; anything else would silently discard the codes).
"""

from __future__ import annotations

import torch
from torch import nn

from ..quant.numerics import code_range
from .files import CheckpointError

PACKED_TYPES = ("QuantLinear", "QuantEmbedding")
BITS = (2, 8)  # the packed weight quantizers' range (2..4 bits two per byte, 5..8 one per byte)


def check_schemes(model: nn.Module, modules: dict, where: str) -> None:
    """Refuse a scheme that the float skeleton ``model`` cannot take (one-line CheckpointError)."""
    for name, scheme in modules.items():
        problem = _scheme_problem(model, name, scheme)
        if problem:
            raise CheckpointError(f"{where}: quant.json, module {name}: {problem}")


def _scheme_problem(model: nn.Module, name: str, scheme) -> str | None:
    if not isinstance(scheme, dict):
        return f"the scheme must be an object, got {type(scheme).__name__}"
    kind = scheme.get("type")
    if kind not in PACKED_TYPES:
        return None  # probes, activation and bitsandbytes modules are checked where they are built
    try:
        old = model.get_submodule(name)
    except AttributeError:
        return "the model has no such module"
    if kind == "QuantLinear":
        if not isinstance(old, nn.Linear):
            return "is not a Linear layer in this model"
        shape = {"in_features": old.in_features, "out_features": old.out_features}
        flags = ("symmetric", "bias")
    else:
        if not isinstance(old, nn.Embedding):
            return "is not an Embedding in this model"
        shape = {"num_embeddings": old.num_embeddings, "embedding_dim": old.embedding_dim}
        flags = ("symmetric",)
    for key, expected in shape.items():
        if scheme.get(key) != expected or not _int(scheme.get(key)):
            return f"{key} must be {expected} (the model's), got {scheme.get(key)!r}"
    for key in flags:
        if not isinstance(scheme.get(key), bool):
            return f"{key} must be true or false, got {scheme.get(key)!r}"
    bits = scheme.get("bits")
    if not _int(bits) or not BITS[0] <= bits <= BITS[1]:
        return f"bits must be an integer in {BITS[0]}..{BITS[1]}, got {bits!r}"
    group = scheme.get("group_size")
    if group is not None and (not _int(group) or group <= 0):
        return f"group_size must be null or a positive integer, got {group!r}"
    return None


def check_codes(modules: dict, state: dict[str, torch.Tensor], where: str) -> None:
    """Refuse stored codes, zero points and scales no quantizer writes (see the module docstring)."""
    for name, scheme in modules.items():
        if isinstance(scheme, dict) and scheme.get("type") in PACKED_TYPES:
            problem = _codes_problem(scheme, state[f"{name}.qweight"], state[f"{name}.scale"],
                                     state.get(f"{name}.zero"))
            if problem:
                raise CheckpointError(f"{where}: module {name}: {problem}")


def _codes_problem(scheme: dict, qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> str | None:
    bits, symmetric = scheme["bits"], scheme["symmetric"]
    qmin, qmax = code_range(bits, symmetric)
    top = qmax - qmin  # the largest stored (unsigned) code
    width = scheme.get("in_features", scheme.get("embedding_dim"))
    u = qweight
    if bits <= 4:
        u = torch.stack((u & 0x0F, u >> 4), dim=-1).flatten(-2)  # (rows, 2·cols), padding nibble included
        if width % 2 and bool(u[:, width:].any()):
            return "the padding nibble of an odd width is not zero"
        u = u[:, :width]
    if u.numel() and int(u.max()) > top:
        return f"codes outside the {bits}-bit range {qmin}..{qmax} (stored value {int(u.max())} > {top})"
    if zero is not None and zero.numel() and int(zero.max()) > 2**bits - 1:
        return f"zero points outside 0..{2**bits - 1}"
    s = scale.float()
    if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
        return "scales must be finite and non-negative"
    if bool((s == 0).any()):
        group = scheme.get("group_size") or width

        def per_column(t: torch.Tensor) -> torch.Tensor:  # [rows, n_groups] -> [rows, width]
            return t.repeat_interleave(group, dim=1)[:, :width]

        z = -qmin if zero is None else per_column(zero.to(torch.int16))  # the stored value of code 0 / zero point
        if bool((per_column(s == 0) & (u.to(torch.int16) != z)).any()):
            return "a zero scale over codes that are not zero (the codes would be lost)"
    return None


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
