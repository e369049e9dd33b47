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
quantized earlier layers, found generically by forward hooks in execution order (no model import). Blocks run
on cached inputs (one model forward in all, cut at the first block), so the cost is a few block forwards per
block rather than a model prefix per stage.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Iterable

import torch
from torch import nn

from diffquant.attention import attention_impl, switchable
from diffquant.dispatch import input_device, place_like, resident
from diffquant.quant.linear import QuantLinear
from diffquant.quant.numerics import PerAxis, code_range, n_groups, quantize_tensor
from diffquant.quant.rtn import check_grid, full_grid_params, rtn_codes

from ..progress import progress_bar

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
    act_order: bool = False, damp: float = 0.01, block_size: int = 128, grid: str = "absmax",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GPTQ codes of ``weight`` [out, in] for Hessian ``H`` [in, in]: (codes, scale [out, n_groups], zero | None).

    ``grid``: "absmax" (codes ±(2**(bits-1)-1)) or "full" (GPTQ's symmetric grid, see ``rtn``; zero points
    2**(bits-1)). Works in float32 (float64 for a float64 weight); the Hessian's inverse is factored in float64.
    """
    check_grid(grid, symmetric)
    rows, cols = weight.shape
    if H.shape != (cols, cols):
        raise ValueError(f"Hessian of shape {tuple(H.shape)} does not fit a weight with {cols} inputs")
    gs = group_size or cols
    groups = n_groups(group_size, cols)  # the last one ragged where gs does not divide cols
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

    full = grid == "full"
    qmin, qmax = (0, 2**bits - 1) if full else code_range(bits, symmetric)
    codes = torch.zeros(rows, cols, dtype=wdt, device=W.device)  # permuted order, integer-valued
    scale = torch.zeros(rows, groups, dtype=wdt, device=W.device)
    zero = None if symmetric and not full else torch.zeros(rows, groups, dtype=wdt, device=W.device)
    ready = [False] * groups
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            g = group_of[i1 + i]
            if not ready[g]:  # first column of this group: scale from the group's current weights
                members = inv_perm[g * gs:(g + 1) * gs]
                s, z = _group_params(W, W1, i1, i2, members, bits, symmetric, full)
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


def _group_params(W, W1, i1, i2, members, bits, symmetric, full):
    """Scale (and zero) of one group from its current values: in-block columns live in W1, the rest in W."""
    vals = W[:, members].clone()
    inside = (members >= i1) & (members < i2)
    vals[:, inside] = W1[:, members[inside] - i1]
    if full:
        return full_grid_params(vals, bits)
    _, s, z, *_ = quantize_tensor(vals, bits, PerAxis((0,)), symmetric)
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
    grid: str = "absmax", sequential: bool = True,
) -> list[str]:
    """Replace the ``nn.Linear`` modules ``names`` of ``model`` by GPTQ ``QuantLinear``s, in execution order.

    ``calib``: batches of token ids, each passed as ``model(batch)``. Returns the names quantized by GPTQ;
    layers the forward never reaches fall back to round-to-nearest (with a warning).

    When every name lies inside the blocks of one ``nn.ModuleList`` (``layers.0``, ``layers.1``, ...), the
    inputs of the first block are captured once and each block then runs on its cached inputs: once per stage
    (cut short after the stage's inputs) and once more for the next block's inputs, instead of a forward of
    the whole model per stage; the results are the same. ``sequential=False`` calibrates all stages of a block
    on one forward of the float block (GPTQModel's ``true_sequential=False``). Fused attention (sdpa) is used
    for the calibration forwards of a model that has it.
    """
    if not calib:
        raise ValueError("GPTQ needs calibration data (calib=...)")
    check_grid(grid, symmetric)
    done: list[str] = []
    start = time.perf_counter()

    def quantize_stage(owner: nn.Module, prefix: str, stage: list[str], hessians: dict, bar) -> None:
        for name in stage:
            linear = owner.get_submodule(name)
            with resident(linear):  # offloaded (device_map): its float weight loaded for this layer only
                codes, scale, zero = gptq_codes(linear.weight, hessians[name].hessian(), bits, group_size,
                                                symmetric, act_order, damp, block_size, grid)
                quantized = QuantLinear.from_codes(linear, codes, scale, zero, bits, group_size)
            owner.set_submodule(name, place_like(quantized, linear))  # written back where the float one lived
            done.append(prefix + name)
            bar.update(1)

    def fallback(owner: nn.Module, prefix: str, left: list[str]) -> None:
        log.warning("GPTQ: %d layers never ran in the forward (%s); using round-to-nearest",
                    len(left), ", ".join(prefix + n for n in left[:3]))
        for name in left:
            linear = owner.get_submodule(name)
            with resident(linear):
                codes, scale, zero = rtn_codes(linear.weight, bits, group_size, symmetric, grid)
                quantized = QuantLinear.from_codes(linear, codes, scale, zero, bits, group_size)
            owner.set_submodule(name, place_like(quantized, linear))

    def run_stages(owner, prefix, left, inputs, forward, bar) -> None:
        while left:
            stage, hessians = _calibrate_next_stage(owner, left, inputs, forward, whole=not sequential)
            if not stage:
                fallback(owner, prefix, left)
                return
            quantize_stage(owner, prefix, stage, hessians, bar)
            left = [n for n in left if n not in stage]

    was_training = model.training
    model.eval()
    blocks = _blocks(model, names)
    try:
        with _fused_attention(model), torch.no_grad(), \
                progress_bar(total=len(names), desc="gptq", unit="layer", disable=None) as bar:
            if blocks is None:  # the generic path: each stage from a forward of the whole model
                run_stages(model, "", list(names), calib, None, bar)
            else:
                inputs = _block_inputs(model, blocks[0][1], calib)
                for i, (prefix, block, local) in enumerate(blocks):
                    run_stages(block, prefix + ".", local, inputs, _run_block, bar)
                    if i + 1 < len(blocks):
                        inputs = [_next_inputs(args, kwargs, _run_block(block, (args, kwargs)))
                                  for args, kwargs in inputs]
                    log.info("GPTQ: %s done (%.1f s)", prefix, time.perf_counter() - start)
    finally:
        model.train(was_training)
    return done


def _blocks(model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module, list[str]]] | None:
    """(prefix, block, names relative to it) for every block of the ModuleList holding ``names``, from the first
    block with a name to the last; None unless every name lies strictly inside a block of one (outermost)
    ModuleList."""
    lists = {n for n, m in model.named_modules() if isinstance(m, nn.ModuleList)}
    owners, where = set(), {}
    for name in names:
        parts = name.split(".")
        hits = [k for k in range(len(parts) - 1) if ".".join(parts[:k]) in lists and parts[k].isdigit()]
        if not hits:
            return None
        k = hits[0]
        owners.add(".".join(parts[:k]))
        where.setdefault(int(parts[k]), []).append(".".join(parts[k + 1:]))
    if len(owners) != 1:
        return None
    owner = owners.pop()
    container, prefix = model.get_submodule(owner), f"{owner}." if owner else ""
    return [(f"{prefix}{i}", container[i], where.get(i, [])) for i in range(min(where), max(where) + 1)]


def _block_inputs(model: nn.Module, first: nn.Module, calib) -> list[tuple[tuple, dict]]:
    """The (args, kwargs) of ``first`` for every calibration batch (the rest of each forward is skipped)."""
    captured: list[tuple[tuple, dict]] = []

    def hook(module, args, kwargs):
        captured.append((args, kwargs))
        raise _StopForward

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    device = input_device(model)
    try:
        for batch in calib:
            try:
                model(batch.to(device))
            except _StopForward:
                pass
    finally:
        handle.remove()
    if len(captured) != len(calib):
        raise ValueError("GPTQ: the first block did not run for every calibration batch")
    return captured


def _run_block(block: nn.Module, inputs: tuple[tuple, dict]):
    args, kwargs = inputs
    return block(*args, **kwargs)


def _next_inputs(args: tuple, kwargs: dict, out) -> tuple[tuple, dict]:
    """The next block's (args, kwargs): this block's output (or its first element) replaces the hidden states."""
    hidden = out[0] if isinstance(out, (tuple, list)) else out
    return (hidden, *args[1:]), kwargs


def _fused_attention(model: nn.Module):
    """Calibrate with sdpa when the model runs eager diffquant attention (same outputs, a fraction of the time on
    CPU); restored afterwards."""
    if getattr(getattr(model, "config", None), "attn_impl", None) != "eager" or not switchable(model):
        return contextlib.nullcontext()
    return attention_impl(model, "sdpa")


def _calibrate_next_stage(
    model: nn.Module, remaining: list[str], inputs: Iterable, forward=None, whole: bool = False,
) -> tuple[list[str], dict[str, HessianAccumulator]]:
    """The next stage (the first remaining Linear to run and those reading the very same input tensor) and
    the Hessians of its layers, accumulated over every input, each run as ``forward(model, item)`` (default
    ``model(item)``, item a batch of token ids).
    ``whole``: every remaining layer that runs is the stage (all Hessians from the same forwards)."""
    stage: list[str] = []
    hessians: dict[str, HessianAccumulator] = {}
    state = {"fixed": False, "first_input": None, "seen": set()}

    def make_hook(name: str):
        def hook(module, args):
            x = args[0]
            if whole:
                if name not in hessians:
                    stage.append(name)
            elif not state["fixed"]:
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
    device = input_device(model)
    forward = forward or (lambda m, batch: m(batch))
    try:
        for item in inputs:
            state["seen"] = set()
            try:
                forward(model, item.to(device) if isinstance(item, torch.Tensor) else item)
            except _StopForward:
                pass
            state["fixed"], state["first_input"] = not whole, None
            if not stage:
                break  # no remaining layer runs in the forward
    finally:
        for h in handles:
            h.remove()
    return stage, hessians
