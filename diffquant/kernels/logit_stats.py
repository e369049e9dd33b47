"""Attention-logit statistics without materialising the logits: a Triton kernel, tile by tile as flash attention.

For one attention call, given the rotated queries q (B, H·s, T, d) and keys k (B, K·s, S, d) as the model's
``attn_q`` / ``attn_k`` probes see them, the logits ``(q·d^-½) kᵀ`` of every head and Diff map (s = 2) are formed
in tiles in registers and never written out. Two passes over the tiles:

1. the bit-pattern histogram of |logit| over the causally kept entries (the bins of ``stats._bins``, NaN / Inf in
   bins of their own), and each program's float32 sum of |logit|;
2. from that histogram, on the device, the bin holding the k-th largest |logit|; every entry in it or above is
   written to a candidate buffer with its flat index into the eager path's (B, H, s, T, S) tensor.

The candidates are then ranked by value, then flat index (the host path's tie rule), on the device. No host sync:
the candidate count and an overflow flag stay on the device; a run whose buffer overflowed is known at its end
(``LogitSummary.overflow``) and must be redone another way. Equality with the eager path holds where the tile
products equal torch's matmul: exactly for dyadic inputs, up to summation order otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..stats import _NBINS, _SHIFT32

_LOW32 = (1 << 32) - 1
_MODES = {torch.float32: ("fp32", 0, 0x7F800000), torch.bfloat16: ("bf16", 1, 0x7F80),
          torch.float16: ("fp16", 1, 0x7C00)}


@triton.jit
def _tile_pass(q_ptr, k_ptr, hist_ptr, sums_ptr, thresh_ptr, cand_val_ptr, cand_idx_ptr, counter_ptr,
               sqb, sqh, sqt, sqd, skb, skh, skt, skd,
               H, T, S, d, q_offset, n_rep, cap,
               SUB: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               HALF: tl.constexpr, INF_BITS: tl.constexpr, SELECT: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)  # (b, h, map) in row-major order
    pid_m = tl.program_id(1)  # query block
    j = pid % SUB
    h = (pid // SUB) % H
    b = pid // (SUB * H)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    qs = tl.load(q_ptr + b * sqb + (h * SUB + j) * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                 mask=(offs_m[:, None] < T) & (offs_d[None, :] < d), other=0.0)  # already scaled by d^-½
    kv_row = (h // n_rep) * SUB + j
    if SELECT:
        tb = tl.load(thresh_ptr)
    row_sum = tl.zeros([BM], dtype=tl.float32)
    hi = tl.minimum(S, q_offset + (pid_m + 1) * BM)  # causal: later keys are masked for every query here
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        kt = tl.load(k_ptr + b * skb + kv_row * skh + offs_n[None, :] * skt + offs_d[:, None] * skd,
                     mask=(offs_n[None, :] < S) & (offs_d[:, None] < d), other=0.0)  # (D, BN)
        if IEEE:  # float32 data: no TF32 rounding of the inputs
            logit = tl.dot(qs, kt, input_precision="ieee")
        else:  # 16-bit data are exact in TF32 (and the interpreter's 16-bit dot is wrong): products as bf16's
            logit = tl.dot(qs.to(tl.float32), kt.to(tl.float32), input_precision="tf32")
        a = tl.abs(logit.to(qs.dtype))
        keep = (offs_m[:, None] < T) & (offs_n[None, :] < S) & (offs_n[None, :] <= offs_m[:, None] + q_offset)
        if HALF:
            bits = a.to(tl.int16, bitcast=True).to(tl.int32)
            bins = bits
        else:
            bits = a.to(tl.int32, bitcast=True)
            bins = (bits >> 12) + (bits > INF_BITS).to(tl.int32)  # NaN one bin past +Inf
        finite = keep & (bits < INF_BITS)
        if SELECT:
            sel = finite & (bins >= tb)
            flat_sel = tl.reshape(sel.to(tl.int32), [BM * BN])
            n_sel = tl.sum(flat_sel, axis=0)
            base = tl.atomic_add(counter_ptr, n_sel)
            slot = base + tl.cumsum(flat_sel, axis=0) - 1
            row = ((b * H + h) * SUB + j).to(tl.int64) * T + offs_m[:, None]
            flat_idx = tl.reshape(row * S + offs_n[None, :], [BM * BN])
            ok = (flat_sel > 0) & (slot < cap)
            tl.store(cand_val_ptr + slot, tl.reshape(a.to(tl.float32), [BM * BN]), mask=ok)
            tl.store(cand_idx_ptr + slot, flat_idx, mask=ok)
        else:
            tl.atomic_add(hist_ptr + bins, tl.full([BM, BN], 1, tl.int32), mask=keep)
            row_sum += tl.sum(tl.where(finite, a.to(tl.float32), 0.0), axis=1)
    if not SELECT:
        tl.store(sums_ptr + pid * tl.num_programs(1) + pid_m, tl.sum(row_sum, axis=0))


@dataclass
class LogitSummary:
    """One call's statistics, all on the device: histogram (int64 counts in ``mode``'s bins, NaN / Inf past the
    finite ones), the top candidates (float64 values descending, ties by flat index; -1 = empty slot), their flat
    indices into ``shape``, the float64 sum of finite |logit| and whether the candidate buffer overflowed."""

    mode: str
    hist: torch.Tensor
    values: torch.Tensor
    index: torch.Tensor
    total: torch.Tensor
    overflow: torch.Tensor
    shape: tuple[int, ...]


def logit_stats(q: torch.Tensor, k: torch.Tensor, n_heads: int, sub: int, topk: int, out_dtype: torch.dtype,
                q_offset: int = 0, block: tuple[int, int] = (64, 64), capacity: int | None = None) -> LogitSummary:
    """Statistics of the causal logits ``(q·d^-½) kᵀ`` (see the module doc). ``q`` (B, n_heads·sub, T, d) and ``k``
    (B, K·sub, S, d) as the probes give them (sub-head 2i + j is head i's map j); ``out_dtype`` is the dtype the
    eager path's logits would have (q's, or autocast's)."""
    if out_dtype not in _MODES:
        raise TypeError(f"logit statistics support float32, bfloat16 and float16, not {out_dtype}")
    mode, half, inf_bits = _MODES[out_dtype]
    B, _, T, d = q.shape
    S = k.shape[2]
    n_rep = n_heads // (k.shape[1] // sub)
    if B * n_heads * sub * T * S > _LOW32:
        raise ValueError("one call has more than 2**32 logits: split the batch")
    q, k = (q * d ** -0.5).to(out_dtype), k.to(out_dtype)  # as eager: q · d^-½ in q's dtype, then the product's
    BM, BN = block
    grid = (B * n_heads * sub, triton.cdiv(T, BM))
    nbins = _NBINS[mode] + (0 if half else 1)
    dev = q.device
    hist = torch.zeros(nbins, dtype=torch.int32, device=dev)
    sums = torch.zeros(grid[0] * grid[1], dtype=torch.float32, device=dev)
    cap = capacity or max(16 * topk, 1 << 16)
    vals = torch.empty(cap, dtype=torch.float32, device=dev)
    idx = torch.empty(cap, dtype=torch.int64, device=dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    args = dict(SUB=sub, D=max(16, triton.next_power_of_2(d)), BM=BM, BN=BN, HALF=half, INF_BITS=inf_bits,
                IEEE=out_dtype == torch.float32)
    common = (*q.stride(), *k.stride(), n_heads, T, S, d, q_offset, n_rep, cap)
    thresh = counter  # unused by the first pass
    _tile_pass[grid](q, k, hist, sums, thresh, vals, idx, counter, *common, SELECT=False, **args)
    thresh = _threshold_bin(hist, mode, inf_bits, topk)
    _tile_pass[grid](q, k, hist, sums, thresh, vals, idx, counter, *common, SELECT=True, **args)
    top_vals, top_idx = _rank(vals, idx, counter, topk)
    shape = (B, n_heads, sub, T, S) if sub > 1 else (B, n_heads, T, S)
    return LogitSummary(mode, hist.long(), top_vals, top_idx, sums.sum(dtype=torch.float64), counter > cap, shape)


def _threshold_bin(hist: torch.Tensor, mode: str, inf_bits: int, topk: int) -> torch.Tensor:
    """The highest bin b whose finite entries at or above it number >= topk (0 when there are fewer): every
    top-k entry lies in a bin >= b. A one-element int32 tensor, computed without leaving the device."""
    end = inf_bits if mode != "fp32" else inf_bits >> _SHIFT32
    at_or_above = hist[:end].long().flip(0).cumsum(0).flip(0)
    return ((at_or_above >= topk).sum() - 1).clamp(min=0).to(torch.int32).view(1)


def _rank(vals: torch.Tensor, idx: torch.Tensor, counter: torch.Tensor, topk: int):
    """Top ``topk`` candidates by value descending, then flat index ascending (the host path's order)."""
    used = torch.arange(vals.numel(), device=vals.device) < counter
    keys = (vals.view(torch.int32).to(torch.int64) << 32) | (_LOW32 - idx)
    keys = torch.where(used, keys, -1)
    top = torch.topk(keys, min(topk, keys.numel()), sorted=True).values
    real = top >= 0
    values = torch.where(real, (top >> 32).to(torch.int32).view(torch.float32).double(), -1.0)
    return values, torch.where(real, _LOW32 - (top & _LOW32), 0)


_CHECKED: dict[str, bool] = {}


def self_check(device: torch.device) -> bool:
    """Whether the kernel reproduces the host profiler on ``device`` (a small dyadic problem, both Diff maps,
    grouped-query heads); run once per device kind and remembered. Any failure (no Triton backend, a compiler
    error, a different answer) means no."""
    key = str(device)
    if key not in _CHECKED:
        _CHECKED[key] = _check(device)
    return _CHECKED[key]


def _check(device: torch.device) -> bool:
    from ..stats import SiteStats
    from ..stats_device import DeviceSiteStats

    gen = torch.Generator().manual_seed(0)
    B, H, K, s, T, d = 2, 4, 2, 2, 80, 16
    q = (torch.randint(-6, 7, (B, H * s, T, d), generator=gen) * 0.5)
    k = (torch.randint(-6, 7, (B, K * s, T, d), generator=gen) * 0.5)
    x = (q.view(B, H, s, T, d) * d ** -0.5) @ k.view(B, K, s, T, d).repeat_interleave(H // K, 1).transpose(-1, -2)
    want = SiteStats(20)
    want.update(x, torch.ones(T, T, dtype=torch.bool).tril())
    try:
        got = DeviceSiteStats(20)
        got.absorb_logits(logit_stats(q.to(device), k.to(device), H, s, 20, torch.float32), tag=0)
        got = got.host()
    except Exception as err:  # noqa: BLE001  (any failure means: use the fallback)
        import logging

        logging.getLogger(__name__).warning("logit-statistics kernel unusable on %s: %s", device, err)
        return False
    same = got.topk.result() == want.topk.result() and got.hist.state_dict() == want.hist.state_dict()
    return same and got.moments.count == want.moments.count
