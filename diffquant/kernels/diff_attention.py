"""Differential attention forward in one Triton kernel: both maps, λ, the head norm and (1 − λ_init), fused.

Per head h (sub-heads 2h, 2h+1 in the projections' own head-major layout), tile by tile as flash attention:
``softmax(Q1K1ᵀ/√d)`` and ``softmax(Q2K2ᵀ/√d)`` with online maxima and sums, each times the 2d-wide value of the
head's kv group, then ``RMSNorm(O1 − λ·O2) · w · (1 − λ_init)`` in the epilogue, λ itself computed from the
layer's four vectors. Compared with the sdpa path (q / k padded to 2d, the value repeated per map, then separate
kernels for λ, the map combination and the norm) it reads q / k at width d, multiplies q kᵀ at d instead of 2d,
and writes only the final (B, H, T, 2d) output: 1.5× the Transformer's attention multiply-adds instead of 2×, and
one launch instead of ~25 per layer.

Forward only: no autograd. The model runs it for inference (``attn_impl`` "triton", or "sdpa" on CUDA; see
:func:`diffquant.attention.diff_kernel_applies`) once :func:`self_check` has passed on the device, dtype and head width.
Numerics: float32 accumulation; float32 inputs multiply in IEEE float32 (tested under ``TRITON_INTERPRET=1``
against a float64 reference and the model's attention), 16-bit inputs on tensor cores with the probabilities
rounded to the value's dtype, as flash attention does (checked on CUDA only: the interpreter's 16-bit dot is
wrong).
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

log = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634


@triton.jit
def _tile(q1, q2, k_ptr, v_ptr, kv1, kv2, vrow, start_n, offs_m, offs_d, offs_v, m1, m2, l1, l2, acc1, acc2,
          skt, skd, svt, svd, S, T, d, scale,
          BN: tl.constexpr, MASK: tl.constexpr, LOWP: tl.constexpr):
    """One key tile of both maps: online softmax (base 2; ``scale`` includes log2 e) and the value products.
    ``MASK``: the tile reaches the causal diagonal or the end of the keys."""
    offs_n = start_n + tl.arange(0, BN)
    kmask = (offs_n[None, :] < S) & (offs_d[:, None] < d)
    kcols = offs_n[None, :] * skt + offs_d[:, None] * skd
    k1 = tl.load(k_ptr + kv1 + kcols, mask=kmask, other=0.0)
    k2 = tl.load(k_ptr + kv2 + kcols, mask=kmask, other=0.0)
    v = tl.load(v_ptr + vrow + offs_n[:, None] * svt + offs_v[None, :] * svd,
                mask=(offs_n[:, None] < S) & (offs_v[None, :] < 2 * d), other=0.0)
    if LOWP:  # 16-bit tensor-core products, float32 accumulation (as flash attention)
        s1 = tl.dot(q1, k1) * scale
        s2 = tl.dot(q2, k2) * scale
    else:
        s1 = tl.dot(q1, k1, input_precision="ieee") * scale
        s2 = tl.dot(q2, k2, input_precision="ieee") * scale
    if MASK:
        keep = (offs_n[None, :] <= offs_m[:, None] + (S - T)) & (offs_n[None, :] < S)
        s1 = tl.where(keep, s1, float("-inf"))
        s2 = tl.where(keep, s2, float("-inf"))
    new1 = tl.maximum(m1, tl.max(s1, axis=1))
    new2 = tl.maximum(m2, tl.max(s2, axis=1))
    p1 = tl.exp2(s1 - new1[:, None])
    p2 = tl.exp2(s2 - new2[:, None])
    c1 = tl.exp2(m1 - new1)
    c2 = tl.exp2(m2 - new2)
    l1 = l1 * c1 + tl.sum(p1, axis=1)
    l2 = l2 * c2 + tl.sum(p2, axis=1)
    if LOWP:
        acc1 = acc1 * c1[:, None] + tl.dot(p1.to(v.dtype), v)
        acc2 = acc2 * c2[:, None] + tl.dot(p2.to(v.dtype), v)
    else:
        acc1 = acc1 * c1[:, None] + tl.dot(p1, v, input_precision="ieee")
        acc2 = acc2 * c2[:, None] + tl.dot(p2, v, input_precision="ieee")
    return new1, new2, l1, l2, acc1, acc2


@triton.jit
def _lambda(lq1_ptr, lk1_ptr, lq2_ptr, lk2_ptr, d, lambda_init, D: tl.constexpr, VECTORS: tl.constexpr):
    """λ: read (``lq1_ptr`` holds it), or exp(λq1·λk1) − exp(λq2·λk2) + λ_init from the layer's vectors."""
    if VECTORS:
        offs = tl.arange(0, D)
        m = offs < d
        a = tl.load(lq1_ptr + offs, mask=m, other=0.0).to(tl.float32)
        b = tl.load(lk1_ptr + offs, mask=m, other=0.0).to(tl.float32)
        c = tl.load(lq2_ptr + offs, mask=m, other=0.0).to(tl.float32)
        e = tl.load(lk2_ptr + offs, mask=m, other=0.0).to(tl.float32)
        lam = tl.exp(tl.sum(a * b, axis=0)) - tl.exp(tl.sum(c * e, axis=0)) + lambda_init
    else:
        lam = tl.load(lq1_ptr).to(tl.float32)
    return lam


@triton.jit
def _diff_forward(q_ptr, k_ptr, v_ptr, o_ptr, lq1_ptr, lk1_ptr, lq2_ptr, lk2_ptr, w_ptr,
                  sqb, sqh, sqt, sqd, skb, skh, skt, skd, svb, svh, svt, svd, sob, soh, sot, sod,
                  H, T, S, d, n_rep, scale, eps, lambda_init,
                  D: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, LOWP: tl.constexpr,
                  LAM_VECTORS: tl.constexpr):
    pid = tl.program_id(0)  # (b, h)
    pid_m = tl.program_id(1)
    h = pid % H
    b = pid // H
    g = h // n_rep
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    offs_v = tl.arange(0, DV)
    qmask = (offs_m[:, None] < T) & (offs_d[None, :] < d)
    qbase = q_ptr + b * sqb + offs_m[:, None] * sqt + offs_d[None, :] * sqd
    q1 = tl.load(qbase + (2 * h) * sqh, mask=qmask, other=0.0)
    q2 = tl.load(qbase + (2 * h + 1) * sqh, mask=qmask, other=0.0)
    m1 = tl.full([BM], float("-inf"), tl.float32)
    m2 = tl.full([BM], float("-inf"), tl.float32)
    l1 = tl.zeros([BM], tl.float32)
    l2 = tl.zeros([BM], tl.float32)
    acc1 = tl.zeros([BM, DV], tl.float32)
    acc2 = tl.zeros([BM, DV], tl.float32)
    kv1 = b * skb + (2 * g) * skh
    kv2 = kv1 + skh
    vrow = b * svb + g * svh
    # Queries sit at the last T of S positions: every key before ``lo`` is visible to every query of this block
    # (no mask), the tiles from ``lo`` to ``hi`` reach the diagonal, later keys are masked for all of them.
    lo = ((S - T) + pid_m * BM) // BN * BN
    hi = tl.minimum(S, (S - T) + (pid_m + 1) * BM)
    for start_n in range(0, lo, BN):
        m1, m2, l1, l2, acc1, acc2 = _tile(q1, q2, k_ptr, v_ptr, kv1, kv2, vrow, start_n, offs_m, offs_d, offs_v,
                                           m1, m2, l1, l2, acc1, acc2, skt, skd, svt, svd, S, T, d, scale,
                                           BN=BN, MASK=False, LOWP=LOWP)
    for start_n in range(lo, hi, BN):
        m1, m2, l1, l2, acc1, acc2 = _tile(q1, q2, k_ptr, v_ptr, kv1, kv2, vrow, start_n, offs_m, offs_d, offs_v,
                                           m1, m2, l1, l2, acc1, acc2, skt, skd, svt, svd, S, T, d, scale,
                                           BN=BN, MASK=True, LOWP=LOWP)
    lam = _lambda(lq1_ptr, lk1_ptr, lq2_ptr, lk2_ptr, d, lambda_init, D=D, VECTORS=LAM_VECTORS)
    o = acc1 / l1[:, None] - lam * (acc2 / l2[:, None])
    vmask = offs_v[None, :] < 2 * d
    o = tl.where(vmask, o, 0.0)
    rms = tl.rsqrt(tl.sum(o * o, axis=1) / (2 * d) + eps)
    w = tl.load(w_ptr + offs_v, mask=offs_v < 2 * d, other=0.0).to(tl.float32)
    o = o * rms[:, None] * w[None, :] * (1.0 - lambda_init)
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sot + offs_v[None, :] * sod, o,
             mask=(offs_m[:, None] < T) & vmask)


def launch_config(d: int) -> tuple[int, int, int]:
    """(BM, BN, num_warps) for head width ``d``: two float32 accumulators of BM × 2d stay in registers, so wide
    heads get more warps (as flash attention does at head width ≥ 128)."""
    return (64, 64, 4) if 2 * d <= 64 else (64, 64, 8)


def diff_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           lam: torch.Tensor | tuple[torch.Tensor, ...], norm_weight: torch.Tensor, lambda_init: float,
                           eps: float = 1e-5, block: tuple[int, int] | None = None,
                           num_warps: int | None = None) -> torch.Tensor:
    """``q`` (B, 2H, T, d), ``k`` (B, 2K, S, d) with sub-heads 2i, 2i+1 = head i's maps; ``v`` (B, K, S, 2d); ``lam``
    λ as a 0-d tensor, or the layer's vectors (λq1, λk1, λq2, λk2) of length d, from which the kernel computes
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init itself (no launches outside it). Returns
    RMSNorm(softmax(Q1K1ᵀ/√d)V − λ·softmax(Q2K2ᵀ/√d)V)·w·(1 − λ_init): (B, H, T, 2d), float32, causal with the
    queries at the last T of the S key positions. ``block`` (BM, BN) and ``num_warps`` default to
    :func:`launch_config`."""
    return _launch(q, k, v, lam, norm_weight, lambda_init, eps, block, num_warps)


def _launch(q, k, v, lam, norm_weight, lambda_init, eps, block, num_warps) -> torch.Tensor:
    """:func:`diff_attention_forward`'s work (the self-check calls it directly)."""
    B, H2, T, d = q.shape
    H, S = H2 // 2, k.shape[2]
    n_rep = H // (k.shape[1] // 2)
    out = torch.empty(B, H, T, 2 * d, dtype=torch.float32, device=q.device)
    BM, BN, warps = launch_config(d)
    BM, BN = block or (BM, BN)
    vectors = isinstance(lam, (tuple, list))
    lams = tuple(t.detach().contiguous() for t in lam) if vectors else (lam.detach().reshape(1),) * 4
    grid = (B * H, triton.cdiv(T, BM))
    _diff_forward[grid](q, k, v, out, *lams, norm_weight.detach().contiguous(),
                        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                        H, T, S, d, n_rep, d ** -0.5 * LOG2E, eps, float(lambda_init),
                        D=max(16, triton.next_power_of_2(d)), DV=max(16, triton.next_power_of_2(2 * d)), BM=BM, BN=BN,
                        LOWP=q.dtype in (torch.float16, torch.bfloat16), LAM_VECTORS=vectors,
                        num_warps=num_warps or warps)
    return out


def interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1`` when this module was imported): then
    on CPU tensors, slowly; otherwise on CUDA tensors only."""
    return type(_diff_forward).__name__ == "InterpretedFunction"


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel can take these inputs: one float dtype of :data:`DTYPES`, a device it runs on, and
    element offsets within int32 (the kernel's index arithmetic)."""
    on_device = q.device.type == "cuda" or (q.device.type == "cpu" and interpreted())
    same = q.dtype in DTYPES and k.dtype == v.dtype == q.dtype and k.device == v.device == q.device
    return on_device and same and max(t.numel() for t in (q, k, v)) < 2**31 and 2 * q.shape[-1] == v.shape[-1]


_CHECKED: dict[tuple[str, torch.dtype, int], bool] = {}


def self_check(device: torch.device, dtype: torch.dtype, d: int = 16) -> bool:
    """Whether the kernel, compiled for head width ``d``, reproduces the float64 formula on ``device`` in ``dtype``
    (small problems: grouped-query heads, partial tiles, queries after cached keys); run once per device, dtype
    and width and remembered. Any failure (no Triton backend, a compiler or resource error at this width, a
    different answer) means no."""
    key = (str(device), dtype, d)
    if key not in _CHECKED:
        _CHECKED[key] = _check(torch.device(device), dtype, d)
    return _CHECKED[key]


def _check(device: torch.device, dtype: torch.dtype, d: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    B, H, K = 2, 4, 2
    tol = 1e-4 if dtype == torch.float32 else 3e-2  # 16-bit: probabilities rounded to the value's dtype
    try:
        for T, S in ((80, 80), (24, 72)):
            q = torch.randn(B, 2 * H, T, d, generator=gen).to(dtype)
            k = torch.randn(B, 2 * K, S, d, generator=gen).to(dtype)
            v = torch.randn(B, K, S, 2 * d, generator=gen).to(dtype)
            vectors = 0.3 * torch.randn(4, d, generator=gen)  # λq1, λk1, λq2, λk2, as the model passes them
            lam = (vectors[0] @ vectors[1]).exp() - (vectors[2] @ vectors[3]).exp() + 0.3
            w = 1 + 0.1 * torch.randn(2 * d, generator=gen)
            got = _launch(q.to(device), k.to(device), v.to(device), tuple(vectors.to(device)), w.to(device), 0.3,
                          1e-5, None, None).cpu().double()
            if not torch.allclose(got, reference(q, k, v, lam, w, 0.3), rtol=tol, atol=tol):
                log.warning("Diff attention kernel disagrees with the reference on %s (%s, d %d): not used", device,
                        dtype, d)
                return False
    except Exception as err:  # noqa: BLE001  (any failure means: use the sdpa path)
        log.warning("Diff attention kernel unusable on %s (%s, d %d): %s", device, dtype, d, err)
        return False
    return True


def reference(q, k, v, lam, w, lambda_init: float, eps: float = 1e-5) -> torch.Tensor:
    """The formula in float64, materialising both maps: what :func:`self_check` holds the kernel to."""
    q, k, v = q.double(), k.double(), v.double()
    B, H2, T, d = q.shape
    S, n_rep = k.shape[2], H2 // k.shape[1]
    k = k.unflatten(1, (-1, 2)).repeat_interleave(n_rep, dim=1).flatten(1, 2)  # (B, 2H, S, d): head h's kv group
    keep = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    p = torch.softmax(((q * d ** -0.5) @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), dim=-1)
    p = p.unflatten(1, (-1, 2))  # (B, H, 2, T, S)
    o = (p[:, :, 0] - float(lam) * p[:, :, 1]) @ v.repeat_interleave(n_rep, dim=1)
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w.double() * (1 - lambda_init)
