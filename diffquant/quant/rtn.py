"""Round-to-nearest weight quantization, per output channel or per group of input columns (a width the group
size does not divide ends in one shorter group).

Two symmetric grids (``grid``):

* ``"absmax"`` (the project's contract, docs/ARCHITECTURE.md §4.2): codes ±(2**(bits-1) - 1),
  ``scale = amax / (2**(bits-1) - 1)``;
* ``"full"`` (GPTQ's "symmetric"): all 2**bits levels, ``scale = 2·amax / (2**bits - 1)``, zero point
  ``2**(bits-1)``, ``code = clamp(round(w / scale) + zero, 0, 2**bits - 1)``. Stored like an asymmetric code
  with a constant zero point, so packed checkpoints need nothing new. At 4 bits its step is 15/14 finer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffquant.quant.numerics import PerAxis, PerGroup, quantize_tensor

__all__ = ["GRIDS", "full_grid_params", "rtn_codes", "weight_granularity"]

GRIDS = ("absmax", "full")


def weight_granularity(group_size: int | None) -> PerAxis | PerGroup:
    """Per output channel (rows of [out, in]) or per group of ``group_size`` contiguous input columns."""
    return PerAxis((0,)) if group_size is None else PerGroup(group_size)



def check_grid(grid: str, symmetric: bool) -> None:
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; expected one of {', '.join(GRIDS)}")
    if grid == "full" and not symmetric:
        raise ValueError("grid 'full' is a symmetric grid; asymmetric quantization already uses all levels")


def full_grid_params(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point of the "full" grid for each row of ``w`` [rows, n] (float; zero as float)."""
    amax = w.abs().amax(dim=1)
    return 2 * amax / (2**bits - 1), torch.full_like(amax, 2 ** (bits - 1))  # GPTQ: (xmax - xmin) / maxq


def rtn_codes(
    weight: torch.Tensor, bits: int, group_size: int | None = None, symmetric: bool = True, grid: str = "absmax"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes [out, in], scale [out, n_groups], zero [out, n_groups] or None) of a float weight [out, in]."""
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-d [out, in], got shape {tuple(weight.shape)}")
    check_grid(grid, symmetric)
    gran = weight_granularity(group_size)
    if grid == "full":
        rows, cols = weight.shape
        gs = group_size or cols
        w = weight.detach().to(torch.float64 if weight.dtype == torch.float64 else torch.float32)
        pad = -cols % gs  # a ragged last group: zeros change no amax
        groups = F.pad(w, (0, pad)).reshape(rows * ((cols + pad) // gs), gs)  # (rows·n_groups, gs)
        s, z = full_grid_params(groups, bits)
        q = torch.round(groups / torch.where(s > 0, s, torch.inf)[:, None]) + z[:, None]
        codes = q.clamp_(0, 2**bits - 1).reshape(rows, cols + pad)[:, :cols].to(torch.int16)
        return codes, s.reshape(rows, -1), z.reshape(rows, -1).to(torch.int16)
    codes, scale, zero, *_ = quantize_tensor(weight.detach(), bits, gran, symmetric)
    return codes, scale.reshape(weight.shape[0], -1), None if zero is None else zero.reshape(weight.shape[0], -1)
