"""Outlier profiling: run data through a model with exact streaming observers on its probes.

``profile(model, batches)`` attaches one :class:`~diffquant.stats.SiteStats` per probe (per layer), streams
every batch through the eager attention path under ``torch.no_grad()``, and pools the layers into one
result per site kind — the paper's Table 5 protocol ("global": top-k and median over all values of all
layers and tokens; causally masked logits never count; both Diff maps pooled). ``protocol="per_sequence"``
is the massive-activations convention instead: top-k and median of each sequence, averaged over sequences.

The top values come with their locations: layer, head, Diff map, sequence, query and key position for
attention logits; layer, sequence, token position, token id and channel for hidden states.

Off the CPU the statistics stay on the device until the run ends (``sync_free``, see stats_device: no host sync
per probe call), and on CUDA the attention-logit statistics come from a Triton kernel that reads q and k while
attention runs fused, never materialising the logits (``logits_kernel``, see kernels/logit_stats). Both give the
host path's results.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from . import distributed
from .attention import attention_impl
from .dispatch import input_device
from .eta import FirstBatchEstimate
from .io import atomic_write_text
from .kinds import ATTENTION_KINDS, ATTN_K, ATTN_LOGITS, ATTN_Q, CAUSAL_KINDS, HIDDEN, TOKEN_KINDS
from .probes import Probe, ProbeCall, hooked, probes
from .progress import progress_bar
from .stats import ExactPass, Quantiles, SiteStats
from .stats_device import CandidateOverflow, DeviceSiteStats, keep_positions
from .tables import TABLE5_RANKS, outlier_table

log = logging.getLogger(__name__)

PROTOCOLS = ("global", "per_sequence")
DEFAULT_SITES = (ATTN_LOGITS, HIDDEN)
ATTN_SITES = ATTENTION_KINDS
# The sync-free statistics (stats_device) on the CPU: off, measured slower there (experiments/bench_profile.py:
# the host path skips most of each warmed-up call with one comparison, the device path ranks every entry).
SYNC_FREE_ON_CPU = False


def _layer_of(name: str) -> int:
    """``layers.3.attn.logits`` -> 3 (our models and HF-style ``model.layers.3...`` names)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "blocks") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return -1


@dataclass
class _ProbeLog:
    """Per-probe observer state: its stats and, for each update call, where the data came from."""

    layer: int
    kind: str
    stats: SiteStats
    calls: list[tuple[int, int]] = field(default_factory=list)  # (first sequence index, query offset)


@dataclass
class OutlierReport:
    """Pooled per-site and per-layer results; ``to_json`` writes the documented schema."""

    data: dict

    @property
    def sites(self) -> dict:
        return self.data["sites"]

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.data, indent=1)
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_json(cls, path: str | Path) -> OutlierReport:
        return cls(json.loads(Path(path).read_text()))

    def table(self, fmt: str = "github") -> str:
        """Table 5 form: one row per site, Top-1/2/3/10/100 and median of |x|."""
        return outlier_table({self.data.get("label", "model"): self.data}, fmt=fmt)


def use_sync_free(sync_free: bool | None, device: torch.device, protocol: str = "global") -> bool:
    """Whether profile keeps its statistics on the device: asked for, or by default off the CPU."""
    if protocol != "global":
        return False  # per-sequence results are read per batch: the host path
    return (device.type != "cpu" or SYNC_FREE_ON_CPU) if sync_free is None else bool(sync_free)


def use_logits_kernel(logits_kernel: bool | None, model: nn.Module, sites: tuple[str, ...], protocol: str) -> bool:
    """Whether the attention-logit statistics come from the Triton kernel (kernels.logit_stats) instead of the
    eager logits: asked for, or by default on CUDA when Triton is there and its self-check passes. Only for our
    models' attention (q / k probes, no sliding window), the global protocol, and when q / k are not profiled."""
    if logits_kernel is False or ATTN_LOGITS not in sites or protocol != "global" or {ATTN_Q, ATTN_K} & set(sites):
        return False
    attns = _kernel_attentions(model)
    if not attns or any(m.logits.window is not None for m in attns.values()):
        return False
    if logits_kernel:
        return True
    device = _device_of(model)
    from .kernels import available

    if device.type != "cuda" or not available():
        return False
    from .kernels.logit_stats import self_check

    return self_check(device)


def _kernel_attentions(model: nn.Module) -> dict[str, nn.Module]:
    """Attention modules whose q / k probes the kernel can read, by qualified name."""
    return {n: m for n, m in model.named_modules()
            if all(hasattr(m, a) for a in ("q", "k", "logits", "sub", "n_heads")) and isinstance(m.logits, Probe)}


class _Profiler:
    def __init__(self, model: nn.Module, sites, topk: int, protocol: str, exact_median: bool,
                 sync_free: bool = False, kernel: bool = False):
        self.protocol, self.topk, self.exact_median = protocol, topk, exact_median
        self.selected = {n: p for n, p in probes(model, tuple(sites)).items()}
        self.logs = {n: _ProbeLog(_layer_of(n), p.kind, self._new_stats(p)) for n, p in self.selected.items()}
        self.device_stats = None if not sync_free else {
            n: DeviceSiteStats(topk, exact_median, -1 if p.kind in TOKEN_KINDS else None)
            for n, p in self.selected.items()}
        self._keeps: dict[tuple, tuple[torch.Tensor, int] | None] = {}  # counted positions per mask shape
        self.kernel = _kernel_attentions(model) if kernel else {}  # attention modules whose logits it profiles
        self._queries: dict[str, torch.Tensor] = {}  # kernel path: a layer's q until its k arrives
        self.seq_base = 0
        self.tokens = 0
        self.ids: list[torch.Tensor] = []
        self.per_seq: dict[str, list[dict]] = {}  # kind -> one result per sequence
        self._seq_stats: dict[str, list[SiteStats]] | None = None

    def _new_stats(self, probe: Probe, topk: int | None = None) -> SiteStats:
        channel_dim = -1 if probe.kind in TOKEN_KINDS else None
        return SiteStats(topk=topk or self.topk, exact_median=self.exact_median, channel_dim=channel_dim)

    def hook_kinds(self, sites: tuple[str, ...]) -> tuple[str, ...]:
        """The probe kinds to hook: with the kernel, the logits come from q and k."""
        if not self.kernel:
            return sites
        return (*(s for s in sites if s != ATTN_LOGITS), ATTN_Q, ATTN_K)

    def hook(self, name: str, probe: Probe, x: torch.Tensor, call: ProbeCall) -> None:
        if probe.kind in (ATTN_Q, ATTN_K) and self.kernel:
            return self._kernel_hook(name, probe, x, call)
        entry = self.logs[name]
        entry.calls.append((self.seq_base, call.q_offset))
        if self.device_stats is not None:
            self.device_stats[name].update(x, self._keep(probe, x, call.q_offset), tag=entry.layer)
            return
        mask = probe.causal_mask(x, call.q_offset)
        entry.stats.update(x.detach(), mask, tag=entry.layer)
        if self._seq_stats is not None:
            for b, seq in enumerate(self._seq_stats[probe.kind]):
                seq.update(x[b].detach(), None if mask is None else mask[0], tag=entry.layer)

    def _kernel_hook(self, name: str, probe: Probe, x: torch.Tensor, call: ProbeCall) -> None:
        """q arrives first and waits; with k, the kernel computes the layer's logit statistics."""
        from .kernels.logit_stats import logit_stats

        prefix = name.rpartition(".")[0]
        if probe.kind == ATTN_Q:
            self._queries[prefix] = x.detach()
            return
        q, attn, entry = self._queries.pop(prefix), self.kernel[prefix], self.logs[f"{prefix}.logits"]
        kind = x.device.type
        out_dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else q.dtype
        summary = logit_stats(q, x.detach(), attn.n_heads, attn.sub, self.topk, out_dtype, q_offset=call.q_offset)
        self.device_stats[f"{prefix}.logits"].absorb_logits(summary, tag=entry.layer)
        entry.calls.append((self.seq_base, call.q_offset))

    def _keep(self, probe: Probe, x: torch.Tensor, q_offset: int) -> tuple[torch.Tensor, int] | None:
        """The counted positions of a causal probe's mask, found once per shape (the only sync they cost)."""
        if not probe.causal:
            return None
        key = (tuple(x.shape[-2:]), x.ndim, q_offset, probe.window, x.device)
        if key not in self._keeps:
            self._keeps[key] = keep_positions(probe.causal_mask(x, q_offset), tuple(x.shape))
        return self._keeps[key]

    def finish(self) -> None:
        """Bring the device statistics to the host (once per run)."""
        if self.device_stats is not None:
            for name, dev in self.device_stats.items():
                self.logs[name].stats = dev.host()
            self.device_stats = None

    def run_batch(self, model: nn.Module, ids: torch.Tensor) -> None:
        if self.protocol == "per_sequence":
            kinds = {p.kind for p in self.selected.values()}
            self._seq_stats = {k: [SiteStats(topk=self.topk) for _ in range(ids.shape[0])] for k in kinds}
        model(ids.to(_device_of(model)))
        if self._seq_stats is not None:
            for kind, seqs in self._seq_stats.items():
                self.per_seq.setdefault(kind, []).extend(s.result() for s in seqs)
        self.ids.append(ids.detach().cpu())
        self.seq_base += ids.shape[0]
        self.tokens += ids.numel()


def _device_of(model: nn.Module) -> torch.device:
    return input_device(model)  # the CPU for a model whose first weights are offloaded (device_map)


def profile(
    model: nn.Module, batches: Iterable[torch.Tensor], sites: Iterable[str] = DEFAULT_SITES, topk: int = 100,
    protocol: str = "global", exact_median: bool = False, chunk: int | None = None, n_locations: int = 20,
    label: str | None = None, progress: bool = True, sync_free: bool | None = None,
    logits_kernel: bool | None = None,
) -> OutlierReport:
    """Profile |x| at the probes of the given kinds over ``batches`` (LongTensors [B, T]).

    The model's outputs are never changed; attention runs eager (``chunk``: query-chunked for long inputs)
    for the duration of the call and the model's own setting is restored afterwards.
    ``exact_median`` makes fp32 medians exact with a second pass over the same batches.
    ``sync_free`` keeps every statistic on the model's device until the end of the run (same results; None:
    off the CPU only, see ``SYNC_FREE_ON_CPU``). ``logits_kernel`` computes the attention-logit statistics with a
    Triton kernel from q and k while attention runs fused (None: on CUDA after a self-check, see
    ``use_logits_kernel``); a run whose top-k candidates overflowed the kernel's buffer is redone without it.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    sites = tuple(sites)
    if not probes(model, sites):
        raise ValueError(f"the model has no probes of kinds {', '.join(sites)}")
    batches = list(batches)
    if not batches:
        raise ValueError("no data to profile: the batch list is empty")
    kernel = use_logits_kernel(logits_kernel, model, sites, protocol)
    try:
        return _profile(model, batches, sites, topk, protocol, exact_median, chunk, n_locations, label, progress,
                        kernel or use_sync_free(sync_free, _device_of(model), protocol), kernel)
    except CandidateOverflow as err:
        log.warning("%s; profiling again from the eager logits", err)
        return _profile(model, batches, sites, topk, protocol, exact_median, chunk, n_locations, label, progress,
                        use_sync_free(sync_free, _device_of(model), protocol), False)


def _profile(model, batches, sites, topk, protocol, exact_median, chunk, n_locations, label, progress,
             sync_free: bool, kernel: bool) -> OutlierReport:
    prof = _Profiler(model, sites, topk, protocol, exact_median, sync_free, kernel)
    first, mine = distributed.block(batches)  # data parallel: a contiguous run of windows per rank
    prof.seq_base = sum(int(b.shape[0]) for b in batches[:first])  # windows keep their global index
    progress = progress and distributed.is_main()

    def local_pass():
        eager = not kernel or bool(set(CAUSAL_KINDS) & set(sites) - {ATTN_LOGITS})  # the kernel needs no logits
        what = f"profile {label or ''}".strip()
        estimate = FirstBatchEstimate(what, sum(ids.numel() for ids in mine), sync=_synchronizer(model),
                                      enabled=progress)
        with _eager_attention(model, chunk, eager), torch.no_grad(), hooked(model, prof.hook,
                                                                             kinds=prof.hook_kinds(sites)):
            for ids in progress_bar(mine, desc=what, disable=not progress, mininterval=2):
                prof.run_batch(model, ids)
                estimate.batch_done(ids.numel())
        prof.finish()
        return None if distributed.is_main() else _shard_state(prof)

    pooled: dict = {}  # rank 0 only: the merged stats stay there, only the final record is broadcast
    distributed.reduce_on_main(local_pass, lambda shares: pooled.update(_absorb_shards(prof, shares, batches)))
    if exact_median and distributed.on_main(lambda: any(e.stats.needs_exact_pass for e in prof.logs.values())):
        _exact_pass(model, mine, prof, pooled, chunk, progress)
    return OutlierReport(distributed.on_main(lambda: _assemble(model, prof, pooled, n_locations, label)))


def _synchronizer(model: nn.Module):
    """What waits for the model's queued device work (None on the CPU, which runs synchronously)."""
    device = _device_of(model)
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def _shard_state(prof: _Profiler) -> dict:
    """What rank 0 needs of another rank's profiler: each probe's stats (sparse state) and call log."""
    return {"logs": {n: (e.stats.state_dict(), e.calls) for n, e in prof.logs.items()}, "per_seq": prof.per_seq}


def _absorb_shards(prof: _Profiler, shares: list[dict | None], batches: list[torch.Tensor]):
    """On rank 0: merge the other ranks' shards after its own, in rank order — the order a single process
    streams the windows in, so top-k ties, call logs and every count come out as in one pass. Returns the
    pooled stats."""
    for share in shares[1:]:
        for name, (state, calls) in share["logs"].items():
            prof.logs[name].stats.merge(SiteStats.from_state_dict(state))
            prof.logs[name].calls.extend(calls)
        for kind, results in share["per_seq"].items():
            prof.per_seq.setdefault(kind, []).extend(results)
    prof.ids = [b.detach().cpu() for b in batches]
    prof.seq_base = sum(int(b.shape[0]) for b in batches)
    prof.tokens = sum(b.numel() for b in batches)
    return _pool_layers(prof)


def _pool_layers(prof: _Profiler) -> dict[str, tuple[SiteStats, list[tuple[int, int]]]]:
    """Per kind: all layers' stats merged in layer order, with the matching concatenated call log."""
    pooled = {}
    for entry in sorted(prof.logs.values(), key=lambda e: e.layer):
        channel_dim = None if entry.stats.channels is None else -1
        fresh = SiteStats(topk=prof.topk, exact_median=prof.exact_median, channel_dim=channel_dim)
        stats, calls = pooled.setdefault(entry.kind, (fresh, []))
        stats.merge(entry.stats)
        calls.extend(entry.calls)
    return pooled


def _exact_pass(model, mine, prof: _Profiler, pooled, chunk, progress: bool) -> None:
    """Second pass over the same data: exact fp32 quantiles per layer and pooled per site. In a process group
    every rank passes its own windows through the merged histograms and rank 0 pools the kept values."""
    hists = distributed.on_main(lambda: None if not distributed.is_distributed() else (
        {n: e.stats.hist.state_dict() for n, e in prof.logs.items()},
        {kind: stats.hist.state_dict() for kind, (stats, _) in pooled.items()}))
    if distributed.is_main():
        layer_pass = {n: e.stats.exact_pass() for n, e in prof.logs.items()}
        site_pass = {kind: stats.exact_pass() for kind, (stats, _) in pooled.items()}
    else:
        qs = next(iter(prof.logs.values())).stats.qs
        layer_pass = {n: ExactPass(Quantiles.from_state_dict(h), qs) for n, h in hists[0].items()}
        site_pass = {kind: ExactPass(Quantiles.from_state_dict(h), qs) for kind, h in hists[1].items()}

    def feed(name, probe, x, call):
        mask = probe.causal_mask(x, call.q_offset)
        layer_pass[name].update(x.detach(), mask)
        site_pass[probe.kind].update(x.detach(), mask)

    def local_pass():
        kinds = tuple(site_pass)
        with _eager_attention(model, chunk), torch.no_grad(), hooked(model, feed, kinds=kinds):
            for ids in progress_bar(mine, desc="exact median pass", disable=not progress, mininterval=2):
                model(ids.to(_device_of(model)))
        return None if distributed.is_main() else (layer_pass, site_pass)

    def merge(shares):
        for layers, sites in shares[1:]:
            for name, part in layers.items():
                layer_pass[name].merge(part)
            for kind, part in sites.items():
                site_pass[kind].merge(part)

    distributed.reduce_on_main(local_pass, merge)


def _eager_attention(model: nn.Module, chunk: int | None, active: bool = True):
    """Attention modules eager (query chunks of ``chunk``) inside the block, restored after it; nothing when not
    ``active``."""
    return attention_impl(model, "eager", chunk) if active else nullcontext()


# -- assembling the JSON record ---------------------------------------------------------------------------

def _assemble(model: nn.Module, prof: _Profiler, pooled, n_locations: int, label: str | None) -> dict:
    ids = torch.cat(prof.ids) if prof.ids else None
    sites, layers = {}, {}
    for entry in prof.logs.values():
        layers.setdefault(entry.layer, {})[entry.kind] = _summary(entry.stats.result(), entry.calls, entry.kind,
                                                                  ids, n_locations)
    for kind, (stats, calls) in pooled.items():
        sites[kind] = _summary(stats.result(), calls, kind, ids, n_locations)
        sites[kind]["log2_histogram"] = stats.hist.log2_histogram()
        if prof.protocol == "per_sequence":
            sites[kind]["per_sequence"] = _average_sequences(prof.per_seq.get(kind, []))
    cfg = getattr(model, "config", None)
    return {
        "label": label,
        "protocol": prof.protocol,
        "tokens": prof.tokens,
        "sequences": prof.seq_base,
        "model": cfg.to_dict() if hasattr(cfg, "to_dict") else {"class": type(model).__name__},
        "sites": sites,
        "layers": [{"layer": i, **layers[i]} for i in sorted(layers)],
    }


def _summary(res: dict, calls: list[tuple[int, int]], kind: str, ids, n_locations: int) -> dict:
    out = {k: v for k, v in res.items() if k not in ("top_coords", "top_tags", "top_calls")}
    out["table5"] = {f"top{r}": (res["top"][r - 1] if len(res["top"]) >= r else None) for r in TABLE5_RANKS}
    tops = zip(res["top"], res["top_coords"], res["top_tags"], res["top_calls"], strict=True)
    out["locations"] = [_locate(kind, v, coords, tag, calls[call], ids) for v, coords, tag, call in
                        list(tops)[:n_locations]]
    return out


def _locate(kind: str, value: float, coords: list[int], layer: int, call: tuple[int, int], ids) -> dict:
    seq_base, q_offset = call
    loc = {"value": value, "layer": layer, "sequence": seq_base + coords[0]}
    if kind in CAUSAL_KINDS:
        loc["head"] = coords[1]
        if len(coords) == 5:
            loc["map"] = coords[2]  # 0 = Q1K1ᵀ, 1 = Q2K2ᵀ
        loc["query"], loc["key"] = q_offset + coords[-2], coords[-1]
    elif kind in TOKEN_KINDS:
        loc["position"], loc["channel"] = coords[1], coords[2]
        if ids is not None:
            loc["token_id"] = int(ids[loc["sequence"], loc["position"]])
    else:  # q / k: (B, heads, T, d)
        loc["head"], loc["position"], loc["channel"] = coords[1], coords[2], coords[3]
    return loc


def _average_sequences(results: list[dict]) -> dict:
    """massive-activations' convention: each rank's value and the median averaged over sequences."""
    if not results:
        return {}
    k = min(len(r["top"]) for r in results)
    top = torch.tensor([r["top"][:k] for r in results], dtype=torch.float64).mean(0).tolist()
    medians = [r["median"] for r in results if r["median"] is not None]
    return {
        "sequences": len(results),
        "top": top,
        "median": sum(medians) / len(medians) if medians else None,
        "table5": {f"top{r}": (top[r - 1] if k >= r else None) for r in TABLE5_RANKS},
    }


def token_batches(ids, seq_len: int, batch_size: int, max_tokens: int | None = None) -> list[torch.Tensor]:
    """Contiguous, non-overlapping windows of ``seq_len`` tokens from a 1-d id array, in batches."""
    if max_tokens and len(ids) < max_tokens:
        log.warning("the data has %d tokens, fewer than the %d asked for: profiling all of them", len(ids), max_tokens)
    ids = torch.as_tensor(ids[: max_tokens] if max_tokens else ids).long()
    n = len(ids) // seq_len
    if n == 0:
        raise ValueError(f"{len(ids)} tokens are fewer than one window of {seq_len}")
    windows = ids[: n * seq_len].view(n, seq_len)
    return list(windows.split(batch_size))
