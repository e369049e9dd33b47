"""GPTQ (Frantar et al., arXiv 2210.17323), written from the paper and its reference algorithm.

For a Linear layer with weight W [out, in] and calibration inputs X, GPTQ quantizes the input columns one at a
time and spreads each column's rounding error over the columns not yet quantized, using the inverse Hessian of
the layer's squared output error, H = 2·XᵀX/N:

* dead inputs (H_ii = 0) get weight 0 and H_ii = 1; damping adds ``damp · mean(diag H)`` to the diagonal;
* the upper Cholesky factor U of H⁻¹ gives the updates: for column i, ``err = (w_i − q_i) / U_ii`` and
  ``W[:, j] −= err · U_ij`` for j > i (lazily within blocks of ``block_size`` columns, then one matmul for the
  rest);
* per-group scales are computed on the fly from the group's *current* (error-updated) weights when its first
  column comes up; with ``act_order`` the columns go by decreasing H_ii but groups stay contiguous in the
  original column order, so the result is stored like any other group-wise quantization (no column index).

``gptq_quantize_`` runs it on a model layer by layer: each stage (the Linear layers that read the same input
tensor, e.g. q/k/v, then out_proj, then gate/up, then down) is calibrated on inputs produced by the already
quantized earlier layers, found generically by forward hooks in execution order (no model import).
"""

from __future__ import annotations

import logging
import math
from typing import Iterable

import torch
from torch import nn
from tqdm.auto import tqdm

from diffquant.quant.linear import QuantLinear
from diffquant.quant.numerics import PerAxis, code_range, quantize
from diffquant.quant.rtn import weight_granularity

log = logging.getLogger(__name__)

__all__ = ["HessianAccumulator", "gptq_codes", "gptq_quantize_"]


class HessianAccumulator:
    """Running ``2·XᵀX/N`` over the rows of the inputs seen (accumulated in float64)."""

    def __init__(self, in_features: int, device=None):
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        rows = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)  # (N, in)
        self.sum.addmm_(rows.T, rows)
        self.count += rows.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.count == 0:
            raise ValueError("no calibration inputs reached this layer")
        return self.sum * (2.0 / self.count)


def _inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + λI)⁻¹, λ = damp·mean(diag H); more damping if H is not positive definite."""
    mean_diag = torch.diag(H).mean()
    for attempt in range(6):
        lam = damp * (10.0 ** attempt) * mean_diag
        L, info = torch.linalg.cholesky_ex(H + lam * torch.eye(H.shape[0], dtype=H.dtype, device=H.device))
        if info == 0:
            if attempt:
                log.warning("GPTQ: Hessian needed damping %.3g (× mean diagonal) to be positive definite",
                            damp * 10.0 ** attempt)
            U, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(L), upper=True)
            if info == 0:
                return U
    raise ValueError("GPTQ: the Hessian is not positive definite even with heavy damping")


def gptq_codes(
    weight: torch.Tensor, H: torch.Tensor, bits: int, group_size: int | None = None, symmetric: bool = True,
    act_order: bool = False, damp: float = 0.01, block_size: int = 128,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GPTQ codes of ``weight`` [out, in] for Hessian ``H`` [in, in]: (codes, scale [out, n_groups], zero | None).

    Works in float32 (float64 for a float64 weight); the Hessian's inverse is factored in float64.
    """
    rows, cols = weight.shape
    if H.shape != (cols, cols):
        raise ValueError(f"Hessian of shape {tuple(H.shape)} does not fit a weight with {cols} inputs")
    weight_granularity(group_size, cols)  # refuses a group size that does not divide the width
    gs = group_size or cols
    n_groups = cols // gs
    wdt = torch.float64 if weight.dtype == torch.float64 else torch.float32
    W = weight.detach().to(wdt).clone()
    H = H.detach().to(torch.float64).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else torch.arange(cols)
    perm = perm.to(W.device)
    W, H = W[:, perm], H[perm][:, perm]
    inv_perm = torch.argsort(perm)
    group_of = (perm // gs).tolist()  # group (in original order) of each permuted column; a list: no device syncs
    U = _inverse_cholesky(H, damp).to(wdt)

    qmin, qmax = code_range(bits, symmetric)
    codes = torch.zeros(rows, cols, dtype=wdt, device=W.device)  # permuted order, integer-valued
    scale = torch.zeros(rows, n_groups, dtype=wdt, device=W.device)
    zero = None if symmetric else torch.zeros(rows, n_groups, dtype=wdt, device=W.device)
    ready = [False] * n_groups
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            g = group_of[i1 + i]
            if not ready[g]:  # first column of this group: scale from the group's current weights
                members = inv_perm[g * gs:(g + 1) * gs]
                s, z = _group_params(W, W1, i1, i2, members, bits, symmetric)
                scale[:, g] = s
                if zero is not None:
                    zero[:, g] = z
                ready[g] = True
            w, z_g = W1[:, i], None if zero is None else zero[:, g]
            q = _round_column(w, scale[:, g], z_g, qmin, qmax)
            codes[:, i1 + i] = q
            err = (w - _dequant_column(q, scale[:, g], z_g)) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]
    codes = codes[:, inv_perm].round().to(torch.int16)
    return codes, scale, None if zero is None else zero.to(torch.int16)


def _group_params(W, W1, i1, i2, members, bits, symmetric):
    """Scale (and zero) of one group from its current values: in-block columns live in W1, the rest in W."""
    vals = W[:, members].clone()
    inside = (members >= i1) & (members < i2)
    vals[:, inside] = W1[:, members[inside] - i1]
    _, s, z, _ = quantize(vals, bits, PerAxis((0,)), symmetric)
    return s[:, 0], None if z is None else z[:, 0].to(vals.dtype)


def _round_column(w, s, z, qmin, qmax):
    """The numerics rounding rule for one column: round(w / s) (+ z), clamped; a zero scale gives code 0 (+ z)."""
    q = torch.round(w / torch.where(s > 0, s, math.inf))
    if z is not None:
        q = q + z
    return q.clamp_(qmin, qmax)


def _dequant_column(q, s, z):
    return (q if z is None else q - z) * s


# ----------------------------------------------------------------------------- model driver


class _StopForward(Exception):
    """Raised by a calibration hook once the stage's layers have seen their inputs (skips the rest)."""


def gptq_quantize_(
    model: nn.Module, names: list[str], calib: list[torch.Tensor], bits: int, group_size: int | None = None,
    symmetric: bool = True, act_order: bool = False, damp: float = 0.01, block_size: int = 128,
) -> list[str]:
    """Replace the ``nn.Linear`` modules ``names`` of ``model`` by GPTQ ``QuantLinear``s, in execution order.

    ``calib``: batches of token ids, each passed as ``model(batch)``. Returns the names quantized by GPTQ;
    layers the forward never reaches fall back to round-to-nearest (with a warning).
    """
    if not calib:
        raise ValueError("GPTQ needs calibration data (calib=...)")
    remaining = list(names)
    done: list[str] = []
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=len(remaining), desc="gptq", unit="layer", disable=None) as bar:
            while remaining:
                stage, hessians = _calibrate_next_stage(model, remaining, calib)
                if not stage:
                    log.warning("GPTQ: %d layers never ran in the forward (%s); using round-to-nearest",
                                len(remaining), ", ".join(remaining[:3]))
                    for name in remaining:
                        _replace(model, name, QuantLinear.from_float(model.get_submodule(name), bits, group_size,
                                                                     symmetric))
                    break
                for name in stage:
                    linear = model.get_submodule(name)
                    codes, scale, zero = gptq_codes(linear.weight, hessians[name].hessian(), bits, group_size,
                                                    symmetric, act_order, damp, block_size)
                    _replace(model, name, QuantLinear.from_codes(linear, codes, scale, zero, bits, group_size))
                    remaining.remove(name)
                    done.append(name)
                    bar.update(1)
    finally:
        model.train(was_training)
    return done


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    model.set_submodule(name, module)


def _calibrate_next_stage(
    model: nn.Module, remaining: list[str], calib: Iterable[torch.Tensor]
) -> tuple[list[str], dict[str, HessianAccumulator]]:
    """The next stage (the first remaining Linear to run and those reading the very same input tensor) and
    the Hessians of its layers, accumulated over every calibration batch."""
    stage: list[str] = []
    hessians: dict[str, HessianAccumulator] = {}
    state = {"fixed": False, "first_input": None, "seen": set()}

    def make_hook(name: str):
        def hook(module, args):
            x = args[0]
            if not state["fixed"]:
                if stage and (x is not state["first_input"] or name in stage):
                    state["fixed"] = True  # a different input: the stage is complete
                    raise _StopForward
                if not stage:
                    state["first_input"] = x
                stage.append(name)
            elif name not in stage:
                return None
            hessians.setdefault(name, HessianAccumulator(x.shape[-1], x.device)).add(x)
            state["seen"].add(name)
            if state["fixed"] and state["seen"] >= set(stage):
                raise _StopForward
            return None

        return hook

    handles = [model.get_submodule(n).register_forward_pre_hook(make_hook(n)) for n in remaining]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in calib:
                state["seen"] = set()
                try:
                    model(batch.to(device))
                except _StopForward:
                    pass
                state["fixed"], state["first_input"] = True, None
                if not stage:
                    break  # no remaining layer runs in the forward
    finally:
        for h in handles:
            h.remove()
    return stage, hessians
