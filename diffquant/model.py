"""The models: a LLaMA-style Transformer, the Differential Transformer (arXiv 2410.05258) and two other
outlier-suppressing attention designs as further arms of the study.

All are decoder-only, pre-RMSNorm, SwiGLU, RoPE, no biases. They differ only in the attention:

* Transformer: ``softmax(Q Kᵀ/√d) V`` per head.
* Diff: each head has two query/key sub-heads (Q1, Q2, K1, K2, each of ``head_dim``) and one value of
  ``2·head_dim``; ``(softmax(Q1K1ᵀ/√d) − λ·softmax(Q2K2ᵀ/√d))·V`` then a per-head RMSNorm(2d) and a factor
  ``1 − λ_init``. Sub-heads are interleaved as in the official code (sub-head 2i = Q1 of head i,
  2i+1 = Q2), which makes q_proj/k_proj/v_proj/out_proj the same shapes as the Transformer's with twice the
  heads.
* Gated (Qiu et al., arXiv 2505.06708, variant G1): ``softmax(Q Kᵀ/√d) V ⊙ σ(X W_θ)``, an elementwise,
  head-specific sigmoid gate of the attention input X on each head's output, before the output projection.
* Clipped (Bondarenko et al., arXiv 2306.12929): ``clip((1 − γ)·softmax(Q Kᵀ/√d) + γ, 0, 1) V``, γ = −12/context,
  so a head can give exact zeros without extreme logits. Always computed on the eager path.

Attention runs as ``eager`` (materialises the logits; the only path probes can observe), ``sdpa``, ``flash`` or
``triton`` (Diff inference through one fused Triton kernel, see :mod:`diffquant.attention`); all give the same
outputs. Every intermediate that users study passes through a ``Probe``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import kinds
from .arches import arch_spec
from .attention import diff_kernel_applies, set_attention_
from .config import ATTN_IMPLS, ModelConfig
from .errors import UserError
from .probes import Probe

INIT_STD = 0.02
LAMBDA_STD = 0.1
# Clipped softmax (Bondarenko et al. 2023): clip((ζ − γ)·softmax + γ, 0, 1) with ζ = 1 and γ = −α / context;
# α = 12 is their OPT (causal LM) setting (scripts/opt_125m_clipped_softmax.sh: --alpha 12, 512-token blocks).
CLIP_ALPHA = 12.0


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or wider if it already is (so float64 reference runs stay float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xw = _wide(x)
        normed = xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, (T, head_dim/2), in float64 (cast where used)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x (..., T, d), as the official code (interleaved=True)."""
    xw = _wide(x)
    cos, sin = cos.to(xw.dtype), sin.to(xw.dtype)
    x1, x2 = xw[..., 0::2], xw[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, d/2, 2)
    return rotated.flatten(-2).type_as(x)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, K, ...) -> (B, K·n_rep, ...): each kv head serves n_rep consecutive query heads."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class KVCache:
    """Rotated keys and values of the positions decoded so far, per layer, for incremental decoding.

    Buffers are allocated once for ``max_len`` positions: keys (B, K·s, max_len, d), values (B, K, max_len, s·d).
    ``LM.forward(ids, cache)`` appends ``ids``' positions and advances ``length`` after the last layer.
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int | None = None, device=None,
                 dtype: torch.dtype = torch.float32):
        max_len = max_len or cfg.max_seq_len
        s, d = cfg.sub_heads_per_head, cfg.head_dim
        self.keys = [torch.empty(batch, cfg.n_kv_heads * s, max_len, d, device=device, dtype=dtype)
                     for _ in range(cfg.n_layers)]
        self.values = [torch.empty(batch, cfg.n_kv_heads, max_len, s * d, device=device, dtype=dtype)
                       for _ in range(cfg.n_layers)]
        self.length = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions of ``layer``; return its keys and values of every position so far."""
        end = self.length + k.shape[-2]
        if end > self.keys[layer].shape[-2]:
            raise ValueError(f"the cache holds {self.keys[layer].shape[-2]} positions; {end} were asked for")
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (e.g. drop finished sequences)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


class Attention(nn.Module):
    """Standard or differential causal self-attention with GQA and interchangeable kernels."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        spec = arch_spec(cfg.arch)  # what this arch's attention computes (diffquant/arches.py)
        self.is_diff, self.is_gated, self.is_clipped = spec.differential, spec.gated, spec.clipped
        self.fused = spec.fused
        self.sub = cfg.sub_heads_per_head  # query/key sub-heads per head: 1 or 2
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_rep = cfg.n_heads // cfg.n_kv_heads
        self.impl = cfg.attn_impl
        self.layer = layer
        self.chunk: int | None = None  # eager only: process queries in chunks of this many (long inputs)
        self.q_proj = nn.Linear(cfg.d_model, cfg.q_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.out_proj = nn.Linear(cfg.q_dim, cfg.d_model, bias=False)
        self.q, self.k = Probe(kinds.ATTN_Q), Probe(kinds.ATTN_K)
        self.logits, self.probs = Probe(kinds.ATTN_LOGITS), Probe(kinds.ATTN_PROBS)
        if self.is_diff:
            self.lambda_init = cfg.lambda_init_at(layer)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                setattr(self, name, nn.Parameter(torch.zeros(self.head_dim).normal_(0.0, LAMBDA_STD)))
            self.subln = RMSNorm(2 * self.head_dim, eps=1e-5)
            self.diff = Probe(kinds.ATTN_DIFF)
        if self.is_gated:  # Qiu et al. 2025, their best variant (G1): elementwise, head-specific, after SDPA
            self.gate_proj = nn.Linear(cfg.d_model, cfg.q_dim, bias=False)
            self.gate = Probe(kinds.ATTN_GATE)
        if self.is_clipped:
            self.clip_gamma = -CLIP_ALPHA / cfg.max_seq_len
            self.clipped_probs = Probe(kinds.ATTN_CLIPPED)

    def lambda_full(self) -> torch.Tensor:
        """λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init, one scalar for the layer, in float32 (or wider)."""
        lam1 = torch.exp(_wide(torch.sum(self.lambda_q1 * self.lambda_k1)))
        lam2 = torch.exp(_wide(torch.sum(self.lambda_q2 * self.lambda_k2)))
        return lam1 - lam2 + self.lambda_init

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        s, d = self.sub, self.head_dim
        q = self.q_proj(x).view(B, T, self.n_heads * s, d).transpose(1, 2)  # (B, H·s, T, d)
        k = self.k_proj(x).view(B, T, self.n_kv * s, d).transpose(1, 2)  # (B, K·s, T, d)
        v = self.v_proj(x).view(B, T, self.n_kv, s * d).transpose(1, 2)  # (B, K, T, s·d)
        q = self.q(apply_rope(q, cos, sin))
        k = self.k(apply_rope(k, cos, sin))
        q_offset = 0
        if cache is not None:  # incremental decoding: attend to every cached position too
            q_offset = cache.length
            k, v = cache.extend(self.layer, k, v)  # (B, K·s, S, d), (B, K, S, s·d)
        attn = self._attend(q, k, v, q_offset)  # (B, H, T, s·d)
        if self.is_gated:
            gate = torch.sigmoid(self.gate_proj(x)).view(B, T, self.n_heads, d).transpose(1, 2)  # (B, H, T, d)
            attn = attn * self.gate(gate)
        attn = attn.transpose(1, 2).reshape(B, T, self.n_heads * s * d)  # (B, T, H·s·d)
        return self.out_proj(attn)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
        """Attention of q (B, H·s, T, d) over k (B, K·s, S, d), v (B, K, S, s·d), Diff's head norm and
        (1 − λ_init) included: (B, H, T, s·d)."""
        B, _, T, d = q.shape
        s, S = self.sub, k.shape[-2]
        if self.is_diff and diff_kernel_applies(self.impl, q, k, v, *self._diff_parameters()):
            return self._diff_kernel(q, k, v)
        q = q.view(B, self.n_heads, s, T, d)  # (B, H, s, T, d): sub-heads 2i, 2i+1 -> head i, maps 0, 1
        k = k.view(B, self.n_kv, s, S, d)  # (B, K, s, S, d)
        if self.impl == "eager" or not self.fused:  # e.g. no fused kernel computes a clipped softmax
            attn = self._eager(q, _repeat_kv(k, self.n_rep), _repeat_kv(v, self.n_rep), q_offset)
        else:
            attn = self._fused(q, k, v, q_offset)
        if self.is_diff:
            attn = self.subln(attn) * (1 - self.lambda_init)
        return attn

    def _diff_parameters(self) -> tuple[torch.Tensor, ...]:
        return self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.subln.weight

    def _diff_kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Both maps, λ, the head norm and (1 − λ_init) in one Triton kernel (forward only; the queries are the
        last of the key positions, as with a cache). Returns the dtype the sdpa path gives (the norm's output)."""
        from .kernels.diff_attention import diff_attention_forward  # Triton is optional: imported when used

        lam = (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2)  # λ computed inside the kernel
        out = diff_attention_forward(q, k, v, lam, self.subln.weight, self.lambda_init, eps=self.subln.eps)
        return out.to(torch.promote_types(q.dtype, self.subln.weight.dtype))

    # -- eager: the observable path -------------------------------------------------------------------
    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
        T = q.shape[-2]
        step = self.chunk or T
        outs = [self._eager_chunk(q[..., i:i + step, :], k, v, q_offset + i) for i in range(0, T, step)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _eager_chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
        """Queries q_offset .. q_offset+C-1 against the keys they may see (so memory is O(C·T))."""
        C = q.shape[-2]
        S = q_offset + C
        k, v = k[..., :S, :], v[..., :S, :]
        scores = (q * self.head_dim ** -0.5) @ k.transpose(-1, -2)  # (B, H, s, C, S)
        scores = self._probe_maps(self.logits, scores, q_offset)
        keep = self.logits.causal_mask(scores, q_offset)
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = F.softmax(_wide(scores), dim=-1).type_as(scores)
        probs = self._probe_maps(self.probs, probs, q_offset)
        if self.is_clipped:  # masked entries: softmax 0 -> γ < 0 -> clipped to 0
            stretched = (1 - self.clip_gamma) * probs + self.clip_gamma
            probs = self._probe_maps(self.clipped_probs, stretched.clamp(0.0, 1.0), q_offset)
        if self.is_diff:
            lam = self.lambda_full().to(probs.dtype)
            attn_map = self.diff(probs[:, :, 0] - lam * probs[:, :, 1], q_offset)  # (B, H, C, S)
        else:
            attn_map = probs[:, :, 0]  # (B, H, C, S)
        return attn_map @ v  # (B, H, C, s·d)

    def _probe_maps(self, probe: Probe, maps: torch.Tensor, q_offset: int) -> torch.Tensor:
        """Show (B, H, 2, T, S) for Diff and (B, H, T, S) for the Transformer, as the contract says."""
        if self.is_diff:
            return probe(maps, q_offset)
        return probe(maps.squeeze(2), q_offset).unsqueeze(2)

    # -- sdpa / flash: fused kernels that never materialise the logits ----------------------------------
    def _fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
        """Both maps in one kernel call: the s maps become s·H query heads (head-major without grouped queries, which
        copies neither q nor k; map-major with them, so grouped-query attention pairs each with its own map's kv
        head); sdpa pads q/k to the value width, flash splits the value."""
        B, H, s, T, d = q.shape
        K, S = k.shape[1], k.shape[3]
        if self.n_rep == 1:  # head-major (head h·s + j) is the projections' own layout: q and k are not copied
            qf, kf = q.reshape(B, H * s, T, d), k.reshape(B, K * s, S, d)  # (B, H·s, T, d), (B, K·s, S, d): views
            vf = v if s == 1 else v.repeat_interleave(s, dim=1)  # (B, K·s, S, s·d): both maps read their head's value
        else:  # grouped queries pair query head i with kv head i // n_rep: map-major keeps each map with its keys
            qf = q.transpose(1, 2).reshape(B, s * H, T, d)  # (B, s·H, T, d), head j·H + h
            kf = k.transpose(1, 2).reshape(B, s * K, S, d)  # (B, s·K, S, d), head j·K + g
            vf = v.unsqueeze(1).expand(B, s, K, S, s * d).reshape(B, s * K, S, s * d)  # each map reads the same value
        scale = self.head_dim ** -0.5
        out = FUSED_KERNELS[self.impl](qf, kf, vf, scale, q_offset)  # (B, s·H, T, s·d)
        if not self.is_diff:
            return out
        maps = out.view(B, H, s, T, s * d).unbind(2) if self.n_rep == 1 else out.view(B, s, H, T, s * d).unbind(1)
        return maps[0] - self.lambda_full().to(out.dtype) * maps[1]  # (B, H, T, 2d)


def _split_value(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 q_offset: int) -> torch.Tensor:
    """softmax(q kᵀ)·[V1|V2] = [softmax(q kᵀ)·V1 | softmax(q kᵀ)·V2] (official flashdiff_2): flash-attn wants equal
    q/k/v widths."""
    d = q.shape[-1]
    if v.shape[-1] == d:
        return attend(q, k, v, scale, q_offset)
    return torch.cat([attend(q, k, v[..., i:i + d], scale, q_offset) for i in range(0, v.shape[-1], d)], dim=-1)


MIN_CPU_WIDTH = 16  # torch's CPU flash kernel runs head widths below 16 ~1.6x slower than 16 (bench_train.py)


def _padded(x: torch.Tensor, width: int) -> torch.Tensor:
    return x if x.shape[-1] >= width else F.pad(x, (0, width - x.shape[-1]))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q_offset: int) -> torch.Tensor:
    """softmax(q kᵀ·scale) v under the causal mask (queries start at position ``q_offset``), grouped-query."""
    if q.device.type == "cpu" and q.shape[-2] == 1 and q_offset == k.shape[-2] - 1:
        return _one_query(q, k, v, scale)
    return _sdpa_kernel(q, k, v, scale, q_offset)


def _one_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A decoding step, one query per row that sees every key, as two batched matmuls: on the CPU 2-4× faster than
    sdpa, which would pad the whole cache to width 16 at every step (``experiments/bench_decode.py``)."""
    B, H, _, d = q.shape
    K = k.shape[1]
    grouped = q.reshape(B, K, H // K, d)  # query head h reads kv head h // n_rep, as enable_gqa pairs them
    scores = (grouped @ k.transpose(-1, -2)) * scale  # (B, K, n_rep, S)
    probs = F.softmax(_wide(scores), dim=-1).type_as(scores)
    return (probs @ v).view(B, H, 1, v.shape[-1])


def _sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q_offset: int) -> torch.Tensor:
    """torch's fused sdpa for ``_sdpa``.

    q and k are zero-padded to the value width (q·kᵀ is unchanged): one fused call then serves Diff's 2d-wide
    value, which torch's CPU sdpa would otherwise run on a 2-3× slower path. On CPU all three are padded to at
    least 16, the narrowest width its kernel runs at full speed; the output keeps the value's width.
    """
    T, S, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    width = max(dv, MIN_CPU_WIDTH) if q.device.type == "cpu" else dv
    q, k, v = _padded(q, width), _padded(k, width), _padded(v, width)
    gqa = q.shape[1] != k.shape[1]
    if q_offset == 0 and T == S:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        positions = torch.arange(S, device=q.device)
        keep = positions[None, :] <= positions[q_offset:q_offset + T, None]  # (T, S)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale, enable_gqa=gqa)
    return out[..., :dv]


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q_offset: int) -> torch.Tensor:
    """The same with flash-attn (GPU), whose layout is (B, T, H, d); its causal mask aligns the last query with
    the last key, which is the offset a KV cache gives."""
    flash_attn_func = _import_flash()
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, softmax_scale=scale)
    return out.transpose(1, 2)


def _import_flash():
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        raise UserError(
            "attn_impl='flash' needs the flash-attn package and a CUDA GPU: pip install 'diffquant[gpu]'"
        ) from None
    return flash_attn_func


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); the product is the probe ``mlp.act``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)
        self.act = Probe(kinds.MLP_ACT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.out = Probe(kinds.HIDDEN)  # the residual stream after both residual adds

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), cos, sin, cache)
        return self.out(h + self.mlp(self.mlp_norm(h)))


class LM(nn.Module):
    """Embedding, blocks, final RMSNorm, output head. ``forward(input_ids [B,T]) -> logits [B,T,V]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits [B, T, V]; with ``cache`` the tokens continue the cached positions (incremental decoding)."""
        start = cache.length if cache is not None else 0
        self._check_input(input_ids, start)
        T = input_ids.shape[1]
        cos, sin = rope_cos_sin(start + T, self.config.head_dim, self.config.rope_theta, input_ids.device)
        cos, sin = cos[start:], sin[start:]
        x = self.embed(input_ids)
        for block in self.layers:
            x = block(x, cos, sin, cache)
        if cache is not None:
            cache.length += T
        return self.head(self.norm(x))

    def _check_input(self, input_ids: torch.Tensor, start: int = 0) -> None:
        if input_ids.ndim != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be an integer tensor [B, T], got {tuple(input_ids.shape)} "
                             f"{input_ids.dtype}")
        T = start + input_ids.shape[1]
        if input_ids.shape[1] == 0 or T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} is outside 1..{self.config.max_seq_len} (max_seq_len)")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in 0..{self.config.vocab_size - 1}, got {lo}..{hi}")

    def set_attn_impl(self, impl: str, chunk: int | None = None) -> LM:
        """Switch every attention to ``impl`` in place (``chunk``: eager query-chunk size for long inputs)."""
        if impl not in ATTN_IMPLS:
            raise ValueError(f"unknown attn_impl {impl!r}; expected one of {', '.join(ATTN_IMPLS)}")
        if impl == "flash":
            _import_flash()
        if chunk is not None and chunk <= 0:
            raise ValueError(f"chunk must be positive, got {chunk}")
        set_attention_([block.attn for block in self.layers], impl, chunk)
        self.config = dataclasses.replace(self.config, attn_impl=impl)
        return self


# attn_impl -> the fused kernel computing softmax(q kᵀ·scale)·v (eager is the observable path, Attention._eager)
FUSED_KERNELS = {
    "sdpa": _sdpa,
    "triton": _sdpa,  # where the fused Diff kernel does not apply (other arches, training, no Triton)
    "flash": lambda q, k, v, scale, q_offset: _split_value(_flash, q, k, v, scale, q_offset),
}


INITS = ("normal", "default")


def _init_weights(model: LM, init: str = "normal") -> None:
    """``normal``: GPT-2 style N(0, 0.02), residual output projections scaled by 1/√(2·n_layers) (nanoGPT,
    llama2.c). ``default``: every Linear keeps PyTorch's default (kaiming-uniform, std 1/√(3·fan_in)) as the
    official Diff-Transformer layers do; the (tied) embedding is N(0, 0.02) in both. λ vectors keep N(0, 0.1)."""
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; expected one of {', '.join(INITS)}")
    resid_std = INIT_STD / math.sqrt(2 * model.config.n_layers)
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or (init == "normal" and isinstance(module, nn.Linear)):
            std = resid_std if name.endswith(("out_proj", "down_proj")) else INIT_STD
            nn.init.normal_(module.weight, 0.0, std)


def build_model(cfg: ModelConfig, seed: int | None = None, init: str = "normal") -> LM:
    """A freshly initialised model (deterministic when ``seed`` is given); ``init`` is "normal" or "default"."""
    if cfg.attn_impl == "flash":
        _import_flash()
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        model = LM(cfg)
        _init_weights(model, init)
    return model


def num_params(model: nn.Module) -> int:
    """Parameter count, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters())
