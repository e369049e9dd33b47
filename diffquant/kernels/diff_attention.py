"""Differential attention forward in one Triton kernel: both maps, λ, the head norm and (1 − λ_init), fused.

Per head h (sub-heads 2h, 2h+1 in the projections' own head-major layout), tile by tile as flash attention:
``softmax(Q1K1ᵀ/√d)`` and ``softmax(Q2K2ᵀ/√d)`` with online maxima and sums, each times the 2d-wide value of the
head's kv group, then ``RMSNorm(O1 − λ·O2) · w · (1 − λ_init)`` in the epilogue. Compared with the sdpa path
(q / k padded to 2d, the value repeated per map, then separate kernels for the λ combination and the norm) it
reads q / k at width d, multiplies q kᵀ at d instead of 2d, and writes only the final (B, H, T, 2d) output:
1.5× the Transformer's attention multiply-adds instead of 2×, and one launch instead of ~20 per layer.

Forward only (inference, profiling, evaluation): no autograd; not wired into the model yet (perf_gpu.py times it
against the sdpa path first). Numerics: float32 accumulation; float32 inputs multiply in IEEE float32 (tested
under ``TRITON_INTERPRET=1`` against a float64 reference and the model's attention), 16-bit inputs on tensor
cores with the probabilities rounded to the value's dtype, as flash attention does (tested on CUDA only: the
interpreter's 16-bit dot is wrong).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _diff_forward(q_ptr, k_ptr, v_ptr, o_ptr, lam_ptr, w_ptr,
                  sqb, sqh, sqt, sqd, skb, skh, skt, skd, svb, svh, svt, svd, sob, soh, sot, sod,
                  H, T, S, d, n_rep, scale, eps, out_scale,
                  D: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, LOWP: tl.constexpr):
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
    hi = tl.minimum(S, (S - T) + (pid_m + 1) * BM)  # queries sit at the last T of S positions
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        kmask = (offs_n[None, :] < S) & (offs_d[:, None] < d)
        kbase = k_ptr + b * skb + offs_n[None, :] * skt + offs_d[:, None] * skd
        k1 = tl.load(kbase + (2 * g) * skh, mask=kmask, other=0.0)
        k2 = tl.load(kbase + (2 * g + 1) * skh, mask=kmask, other=0.0)
        v = tl.load(v_ptr + b * svb + g * svh + offs_n[:, None] * svt + offs_v[None, :] * svd,
                    mask=(offs_n[:, None] < S) & (offs_v[None, :] < 2 * d), other=0.0)
        keep = (offs_n[None, :] <= offs_m[:, None] + (S - T)) & (offs_n[None, :] < S)
        if LOWP:  # 16-bit tensor-core products, float32 accumulation (as flash attention)
            s1 = tl.dot(q1, k1)
            s2 = tl.dot(q2, k2)
        else:
            s1 = tl.dot(q1, k1, input_precision="ieee")
            s2 = tl.dot(q2, k2, input_precision="ieee")
        s1 = tl.where(keep, s1 * scale, float("-inf"))
        s2 = tl.where(keep, s2 * scale, float("-inf"))
        new1 = tl.maximum(m1, tl.max(s1, axis=1))
        new2 = tl.maximum(m2, tl.max(s2, axis=1))
        p1 = tl.exp(s1 - new1[:, None])
        p2 = tl.exp(s2 - new2[:, None])
        c1 = tl.exp(m1 - new1)
        c2 = tl.exp(m2 - new2)
        l1 = l1 * c1 + tl.sum(p1, axis=1)
        l2 = l2 * c2 + tl.sum(p2, axis=1)
        if LOWP:
            acc1 = acc1 * c1[:, None] + tl.dot(p1.to(v.dtype), v)
            acc2 = acc2 * c2[:, None] + tl.dot(p2.to(v.dtype), v)
        else:
            acc1 = acc1 * c1[:, None] + tl.dot(p1, v, input_precision="ieee")
            acc2 = acc2 * c2[:, None] + tl.dot(p2, v, input_precision="ieee")
        m1 = new1
        m2 = new2
    lam = tl.load(lam_ptr)
    o = acc1 / l1[:, None] - lam * (acc2 / l2[:, None])
    vmask = offs_v[None, :] < 2 * d
    o = tl.where(vmask, o, 0.0)
    rms = tl.rsqrt(tl.sum(o * o, axis=1) / (2 * d) + eps)
    w = tl.load(w_ptr + offs_v, mask=offs_v < 2 * d, other=0.0)
    o = o * rms[:, None] * w[None, :] * out_scale
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sot + offs_v[None, :] * sod, o,
             mask=(offs_m[:, None] < T) & vmask)


def diff_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor,
                           norm_weight: torch.Tensor, lambda_init: float, eps: float = 1e-5,
                           block: tuple[int, int] = (64, 64)) -> torch.Tensor:
    """``q`` (B, 2H, T, d), ``k`` (B, 2K, S, d) with sub-heads 2i, 2i+1 = head i's maps; ``v`` (B, K, S, 2d); ``lam``
    a 0-d tensor. Returns RMSNorm(softmax(Q1K1ᵀ/√d)V − λ·softmax(Q2K2ᵀ/√d)V)·w·(1 − λ_init): (B, H, T, 2d),
    float32, causal with the queries at the last T of the S key positions."""
    B, H2, T, d = q.shape
    H, S = H2 // 2, k.shape[2]
    n_rep = H // (k.shape[1] // 2)
    out = torch.empty(B, H, T, 2 * d, dtype=torch.float32, device=q.device)
    BM, BN = block
    lam = lam.detach().float().reshape(1)
    w = norm_weight.detach().float().contiguous()
    grid = (B * H, triton.cdiv(T, BM))
    _diff_forward[grid](q, k, v, out, lam, w, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                        H, T, S, d, n_rep, d ** -0.5, eps, 1.0 - lambda_init,
                        D=max(16, triton.next_power_of_2(d)), DV=max(16, triton.next_power_of_2(2 * d)), BM=BM, BN=BN,
                        LOWP=q.dtype in (torch.float16, torch.bfloat16))
    return out
