"""Issues 16 and 38: the GPU speed ratios in bf16, side by side in one run (≤ 5 minutes on an H200), or on the CPU
at toy sizes.

    python experiments/gpu/perf_gpu.py --out experiments/results/gpu-perf     # one H200: ≤ 5 minutes
    python experiments/gpu/perf_gpu.py --dry-run --out /tmp/gpu-perf-dry      # CPU, toy sizes (tested in CI)

``--time-limit S`` (default 240 s, leaving time to start Python and CUDA within 5 minutes): every measurement
checks it before it starts, and timed repeats stop early (after at least one) once it has passed; what the guard
skipped is listed in the outputs.

1. **Diff ÷ Transformer forward throughput** at matched parameters (``ModelConfig.preset(name, arch=...)``),
   presets ``small`` and ``base``, bf16 autocast, fp32 weights, one row per attention implementation: ``sdpa``
   (torch's sdpa alone: the automatic Diff kernel off), ``triton`` (Diff attention through the fused Triton
   kernel, ``diffquant.kernels.diff_attention``; the Transformer runs sdpa; where the kernel passes its bf16
   self-check on the device) and flash-attn where the package imports (absences are recorded as skipped).
   Warm-up, then repeats alternating the two archs, each timed between ``torch.cuda.synchronize()`` calls;
   medians, tokens/s.
2. **Profiling overhead**: ``diffquant.profile(model, batches, sites=("hidden", "attn_logits"))`` and hidden-only
   ÷ a plain eager forward over the same batches (Diff, bf16 autocast, alternating repeats, medians), plus an sdpa
   forward for reference and the profiling throughput in tokens/s, for ``small`` and ``base``; each profile in
   its variants: host statistics (``sync_free=False``), sync-free statistics (``sync_free=True``) and, where the
   Triton kernel passes its self-check on the device, hidden + logits from the kernel while attention runs fused
   (``logits_kernel=True``, attention "triton"; its goal is ≤ 1.5× the sdpa forward).
4. **Training-step throughput**, presets ``xs``, ``s`` and ``small``: forward, cross-entropy, backward and an
   AdamW step under bf16 autocast with sdpa attention; tokens/s and Diff ÷ Transformer.

5. **Attention alone** (``small`` and ``base`` shapes, bf16, no grad): the Transformer's sdpa call, Diff's sdpa
   path as the model runs it (padded q / k, value per map, λ combination, head norm) and the fused Triton Diff
   forward (``diffquant.kernels.diff_attention``; where it passes its self-check) at its default launch
   configuration and at each of ``LAUNCH_CONFIGS``, as time ratios to the Transformer's.

``--trace DIR`` also records torch-profiler traces (Chrome JSON) and per-kernel tables of one Diff and one
Transformer sdpa forward, one Diff forward with the fused kernel (where it runs) and each profiling variant (small
preset; the dry run: tiny), to count kernels.
3. **GPTQ 4-bit per channel on stories260K** on the GPU: perplexity before / after (fp32 and bf16 autocast) and
   the wall time of ``quantize_model``; windows as experiments/bench_gptq.py draws them (eval: the first 64 ×
   256 tokens of the cased TinyStories sample; calibration: 128 × 256 tokens of the train split, seed 0), RTN
   as a reference row.

Outputs under ``--out``: ``perf_gpu.json`` (everything) and ``perf_gpu.md`` (the tables).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from diffquant import ModelConfig, build_model, load_checkpoint, num_params, profile
from diffquant.attention import auto_diff_kernel, diff_kernel_applies
from diffquant.checkpoint.gguf import stories260k_path
from diffquant.profile import token_batches
from diffquant.quant import QuantConfig, WeightQuant, quantize_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench_gptq  # noqa: E402  (cased_ids, eval_windows, calib_windows, ROWS)

ARCHS = ("transformer", "diff")
NO_CUDA = "no CUDA GPU here: run with --dry-run, or on a GPU machine"


@dataclasses.dataclass(frozen=True)
class Plan:
    device: str
    time_limit_s: float
    shapes: dict  # throughput preset -> (batch, seq_len)
    impls: tuple[str, ...]
    warmup: int
    repeats: int
    inner: int  # forwards per timed repeat (throughput)
    profile_tokens: dict  # profiling preset -> tokens (windows of the preset's max_seq_len)
    profile_batch: int
    profile_repeats: int
    train_shapes: dict  # training-step preset -> (batch, seq_len)
    gptq_rows: tuple[str, ...]  # rows of bench_gptq.ROWS
    calib: tuple[int, int]  # windows, seq_len (cut from bench_gptq's 128 x 256)
    eval: tuple[int, int]  # windows, seq_len (cut from bench_gptq's 64 x 256)


FULL = Plan(device="cuda", time_limit_s=240, shapes={"small": (64, 256), "base": (8, 1024)},
            impls=("sdpa", "triton", "flash"),
            warmup=3, repeats=10, inner=5, profile_tokens={"small": 16384, "base": 65536}, profile_batch=8,
            profile_repeats=3, train_shapes={"xs": (128, 512), "s": (64, 512), "small": (64, 256)},
            gptq_rows=("rtn", "gptq-full"), calib=(128, 256), eval=(64, 256))
DRY = Plan(device="cpu", time_limit_s=120, shapes={"tiny": (2, 64)}, impls=("sdpa", "triton", "flash"), warmup=1,
           repeats=2,
           inner=1, profile_tokens={"tiny": 256}, profile_batch=2, profile_repeats=1, train_shapes={"tiny": (2, 32)},
           gptq_rows=("rtn", "gptq-full"),
           calib=(4, 64), eval=(2, 64))


class Guard:
    """The script's time limit: ``ok(what)`` says whether a measurement may start and records what it skips."""

    def __init__(self, limit_s: float):
        self.start, self.limit_s, self.skipped = time.monotonic(), limit_s, []

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def passed(self) -> bool:
        return self.elapsed() > self.limit_s

    def ok(self, what: str) -> bool:
        if self.passed():
            self.skipped.append({"what": what, "at_s": round(self.elapsed(), 1)})
            return False
        return True


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def timed(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def alternate(fns: dict, device: torch.device, warmup: int, repeats: int, guard: Guard) -> dict[str, list[float]]:
    """Warm-up, then ``repeats`` rounds timing every fn once per round (stopping early once the guard has passed)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for r in range(repeats):
        if r and guard.passed():
            break
        for name, fn in fns.items():
            times[name].append(timed(fn, device))
    return times


def flash_status() -> dict:
    try:
        import flash_attn
    except Exception as e:  # ImportError, or a build that does not match this torch / GPU
        return {"available": False, "reason": f"{type(e).__name__}: {e}".strip()[:300]}
    return {"available": True, "version": getattr(flash_attn, "__version__", "?")}


def forwards(model, impl: str, batches: list[torch.Tensor], device: torch.device):
    """A function running ``model`` (attention ``impl``) on each batch, no grad, bf16 autocast; "sdpa" is torch's
    sdpa alone (the automatic Diff kernel off: "triton" is the row that has it)."""
    def run():
        model.set_attn_impl(impl)
        with torch.no_grad(), autocast(device), auto_diff_kernel(False):
            for ids in batches:
                model(ids)
    return run


def diff_kernel_status(device: torch.device, presets) -> dict:
    """Whether the fused Diff attention kernel runs here in bf16 at the head widths of ``presets``' Diff models
    (CUDA, Triton, self-check passed)."""
    from diffquant.kernels import available

    if device.type != "cuda" or not available():
        return {"available": False, "reason": "needs CUDA and triton"}
    from diffquant.kernels.diff_attention import self_check

    widths = sorted({ModelConfig.preset(p, arch="diff").head_dim for p in presets})
    failed = [d for d in widths if not self_check(device, torch.bfloat16, d)]
    return {"available": not failed} | ({"reason": f"self-check failed at head width {failed}"} if failed else {})


def kernel_runs_in(model, device: torch.device) -> bool:
    """Whether ``model``'s first Diff attention takes the fused kernel for a bf16 call as :func:`forwards` runs it."""
    attn = model.layers[0].attn
    B, T, d = 1, 16, attn.head_dim
    q = torch.zeros(B, 2 * attn.n_heads, T, d, device=device, dtype=torch.bfloat16)
    k = torch.zeros(B, 2 * attn.n_kv, T, d, device=device, dtype=torch.bfloat16)
    v = torch.zeros(B, attn.n_kv, T, 2 * d, device=device, dtype=torch.bfloat16)
    with torch.no_grad(), auto_diff_kernel(False):
        return diff_kernel_applies(attn.impl, q, k, v, *attn._diff_parameters())


PROFILE_VARIANTS = {  # name -> (sites, profile keyword arguments)
    "hidden": (("hidden",), {"sync_free": False}),
    "hidden_syncfree": (("hidden",), {"sync_free": True}),
    "hidden_logits": (("hidden", "attn_logits"), {"sync_free": False, "logits_kernel": False}),
    "hidden_logits_syncfree": (("hidden", "attn_logits"), {"sync_free": True, "logits_kernel": False}),
    "hidden_logits_kernel": (("hidden", "attn_logits"), {"logits_kernel": True}),
}


def profiling_run(model, batches: list[torch.Tensor], sites: tuple[str, ...], device: torch.device, **options):
    """A function profiling ``sites`` over the batches under bf16 autocast: eager attention, except with the logits
    kernel, which reads q and k while attention runs fused ("triton": the Diff kernel where it runs, else sdpa)."""
    def run():
        model.set_attn_impl("triton" if options.get("logits_kernel") else "eager")
        with autocast(device):
            profile(model, batches, sites=sites, progress=False, **options)
    return run


def kernel_status(device: torch.device) -> dict:
    """Whether the Triton logit-statistics kernel runs here (CUDA, Triton, self-check passed)."""
    from diffquant.kernels import available

    if device.type != "cuda" or not available():
        return {"available": False, "reason": "needs CUDA and triton"}
    from diffquant.kernels.logit_stats import self_check

    return {"available": self_check(device)} | ({} if self_check(device) else {"reason": "self-check failed"})


# -- 1. throughput ------------------------------------------------------------------------------------------------

def unavailable(impl: str, flash: dict, diff_kernel: dict) -> str | None:
    """Why a throughput row of ``impl`` cannot run here (None: it can)."""
    if impl == "flash" and not flash["available"]:
        return f"flash-attn not importable: {flash['reason']}"
    if impl == "triton" and not diff_kernel["available"]:
        return f"fused Diff kernel: {diff_kernel['reason']}"
    return None


def throughput(plan: Plan, device: torch.device, guard: Guard, flash: dict,
               diff_kernel: dict) -> tuple[list[dict], list[dict]]:
    rows, skipped = [], []
    for preset, (batch, seq_len) in plan.shapes.items():
        models = {a: build_model(ModelConfig.preset(preset, arch=a), seed=0).to(device).eval() for a in ARCHS}
        params = {a: num_params(m) for a, m in models.items()}
        ids = torch.randint(0, models["diff"].config.vocab_size, (batch, seq_len), device=device)
        for impl in plan.impls:
            if reason := unavailable(impl, flash, diff_kernel):
                skipped.append({"preset": preset, "impl": impl, "reason": reason})
                continue
            if not guard.ok(f"throughput {preset} {impl}"):
                continue
            try:
                fns = {a: forwards(m, impl, [ids] * plan.inner, device) for a, m in models.items()}
                times = alternate(fns, device, plan.warmup, plan.repeats, guard)
            except Exception as e:  # e.g. a flash-attn build that rejects this head width
                skipped.append({"preset": preset, "impl": impl, "reason": f"{type(e).__name__}: {e}"[:300]})
                continue
            tok_s = {a: batch * seq_len * plan.inner / statistics.median(t) for a, t in times.items()}
            rows.append({"preset": preset, "impl": impl, "batch": batch, "seq_len": seq_len, "params": params,
                         "repeats": len(times["diff"]), "seconds": {a: statistics.median(t) for a, t in times.items()},
                         "tokens_per_s": tok_s, "ratio_diff_over_transformer": tok_s["diff"] / tok_s["transformer"],
                         "diff_kernel_ran": kernel_runs_in(models["diff"], device)})
        del models
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, skipped


# -- 2. profiling overhead ----------------------------------------------------------------------------------------

def profiling(plan: Plan, device: torch.device, guard: Guard, kernel: dict, diff_kernel: dict) -> list[dict]:
    rows = []
    for preset, tokens in plan.profile_tokens.items():
        if not guard.ok(f"profiling {preset}"):
            continue
        model = build_model(ModelConfig.preset(preset, arch="diff"), seed=0).to(device).eval()
        seq_len = model.config.max_seq_len
        gen = torch.Generator().manual_seed(0)
        batches = [b.to(device) for b in token_batches(torch.randint(0, model.config.vocab_size, (tokens,),
                                                                     generator=gen), seq_len, plan.profile_batch)]
        n_tokens = sum(b.numel() for b in batches)

        fns = {"plain_eager": forwards(model, "eager", batches, device),
               "plain_sdpa": forwards(model, "sdpa", batches, device)}
        if diff_kernel["available"]:
            fns["plain_triton"] = forwards(model, "triton", batches, device)
        for name, (sites, options) in PROFILE_VARIANTS.items():
            if name.endswith("_kernel") and not kernel["available"]:
                continue
            fns[name] = profiling_run(model, batches, sites, device, **options)
        times = alternate(fns, device, 1, plan.profile_repeats, guard)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"preset": preset, "arch": "diff", "tokens": n_tokens, "batch": plan.profile_batch,
                     "seq_len": seq_len, "repeats": len(times["hidden"]), "seconds": med,
                     "ratio_to_eager": {k: med[k] / med["plain_eager"] for k in med if k != "plain_eager"},
                     "ratio_to_sdpa": {k: med[k] / med["plain_sdpa"] for k in med if k != "plain_sdpa"},
                     "tokens_per_s": {k: n_tokens / v for k, v in med.items()}})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# -- 4. training steps -------------------------------------------------------------------------------------------

def training_step(model, opt, ids: torch.Tensor, device: torch.device):
    """One optimizer step as train.py takes it: bf16 autocast forward, float32 cross-entropy, backward, AdamW."""
    def run():
        with autocast(device):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return run


def training(plan: Plan, device: torch.device, guard: Guard) -> list[dict]:
    rows = []
    for preset, (batch, seq_len) in plan.train_shapes.items():
        if not guard.ok(f"training {preset}"):
            continue
        models = {a: build_model(ModelConfig.preset(preset, arch=a, attn_impl="sdpa"), seed=0).to(device).train()
                  for a in ARCHS}
        ids = torch.randint(0, models["diff"].config.vocab_size, (batch, seq_len + 1), device=device)
        fns = {a: training_step(m, torch.optim.AdamW(m.parameters(), lr=1e-4), ids, device) for a, m in models.items()}
        times = alternate(fns, device, plan.warmup, plan.repeats, guard)
        tok_s = {a: batch * seq_len / statistics.median(t) for a, t in times.items()}
        rows.append({"preset": preset, "batch": batch, "seq_len": seq_len, "repeats": len(times["diff"]),
                     "tokens_per_s": tok_s, "ratio_diff_over_transformer": tok_s["diff"] / tok_s["transformer"]})
        del models, fns
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# -- 5. attention alone -------------------------------------------------------------------------------------------

LAUNCH_CONFIGS = ((64, 32, 4), (64, 64, 4), (64, 64, 8), (128, 64, 8), (128, 32, 8))  # (BM, BN, num_warps)


def attention_fns(preset: str, B: int, T: int, device: torch.device, fused: bool) -> dict:
    """Closures running one attention layer's core: the Transformer's sdpa call, Diff's sdpa path as the model runs
    it, and (``fused``) the Triton Diff forward at its default launch configuration and at each of
    ``LAUNCH_CONFIGS``; bf16 inputs."""
    cfg = ModelConfig.preset(preset, arch="diff")
    attn = build_model(cfg, seed=0).layers[0].attn.to(device).eval()
    H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, qt, kt, vt = (torch.randn(B, 2 * n, T, d, generator=gen, device=device, dtype=torch.bfloat16)
                        for n in (H, K, H, K, K))
    v = torch.randn(B, K, T, 2 * d, generator=gen, device=device, dtype=torch.bfloat16)

    def transformer():
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=H != K)

    def diff_sdpa():
        attn.impl = "sdpa"
        with autocast(device):
            out = attn._fused(q.view(B, H, 2, T, d), k.view(B, K, 2, T, d), v, 0)
            attn.subln(out) * (1 - attn.lambda_init)

    fns = {"transformer_sdpa": transformer, "diff_sdpa": diff_sdpa}
    if fused:
        from diffquant.kernels.diff_attention import diff_attention_forward

        def fused_kernel(block=None, warps=None):
            return lambda: diff_attention_forward(q, k, v, attn.lambda_full(), attn.subln.weight, attn.lambda_init,
                                                  block=block, num_warps=warps)

        fns["diff_fused_kernel"] = fused_kernel()
        for bm, bn, warps in LAUNCH_CONFIGS:
            fns[f"diff_fused_{bm}x{bn}_w{warps}"] = fused_kernel((bm, bn), warps)
    return fns


def runnable(fns: dict, device: torch.device) -> tuple[dict, dict]:
    """The closures that run once without an error (e.g. a launch configuration out of shared memory) and the
    others' errors."""
    ok, failed = {}, {}
    for name, fn in fns.items():
        try:
            fn()
            sync(device)
            ok[name] = fn
        except Exception as e:  # noqa: BLE001  (recorded; the others are still timed)
            failed[name] = f"{type(e).__name__}: {e}"[:300]
    return ok, failed


def attention_rows(plan: Plan, device: torch.device, guard: Guard, diff_kernel: dict) -> list[dict]:
    """Time one attention layer's core per arch and path on the throughput shapes (no grad)."""
    rows = []
    fused = diff_kernel["available"]
    for preset, (batch, seq_len) in plan.shapes.items():
        if not guard.ok(f"attention {preset}"):
            continue
        with torch.no_grad():
            fns, failed = runnable(attention_fns(preset, batch, seq_len, device, fused), device)
            times = alternate(fns, device, plan.warmup, plan.repeats, guard)
        med = {name: statistics.median(t) for name, t in times.items()}
        configs = {n: t for n, t in med.items() if n.startswith("diff_fused_")}
        rows.append({"preset": preset, "batch": batch, "seq_len": seq_len, "seconds": med,
                     "time_over_transformer": {n: t / med["transformer_sdpa"] for n, t in med.items()},
                     "fastest_launch_config": min(configs, key=configs.get) if configs else None,
                     "failed": failed, "fused_kernel": "timed" if fused else f"skipped: {diff_kernel.get('reason')}"})
    return rows


# -- traces -------------------------------------------------------------------------------------------------------

def traces(plan: Plan, device: torch.device, folder: Path, kernel: dict, diff_kernel: dict) -> dict:
    """torch-profiler traces of one sdpa forward per arch and of each profiling variant: Chrome JSON plus a table
    of the kernels (or CPU ops) with their call counts, to see where the time and the launches go."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    folder.mkdir(parents=True, exist_ok=True)
    preset = "tiny" if plan.device == "cpu" else "small"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    models = {a: build_model(ModelConfig.preset(preset, arch=a), seed=0).to(device).eval() for a in ARCHS}
    ids = torch.randint(0, models["diff"].config.vocab_size, (plan.profile_batch, models["diff"].config.max_seq_len),
                        device=device)
    runs = {f"forward_sdpa_{a}": forwards(m, "sdpa", [ids], device) for a, m in models.items()}
    if diff_kernel["available"]:
        runs["forward_triton_diff"] = forwards(models["diff"], "triton", [ids], device)
    for name, (sites, options) in PROFILE_VARIANTS.items():
        if not name.endswith("_kernel") or kernel["available"]:
            runs[f"profile_{name}"] = profiling_run(models["diff"], [ids], sites, device, **options)
    counts = {}
    for name, fn in runs.items():
        fn()  # warm-up (and the kernel's compilation)
        sync(device)
        with torch_profile(activities=activities) as prof:
            fn()
            sync(device)
        prof.export_chrome_trace(str(folder / f"{name}.json"))
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        (folder / f"{name}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))
        events = prof.key_averages()
        counts[name] = {"events": sum(e.count for e in events),
                        "device_kernels": sum(e.count for e in events if e.device_type.name == "CUDA")}
    return counts


# -- 3. GPTQ on stories260K ---------------------------------------------------------------------------------------

def perplexity(model, x: torch.Tensor, y: torch.Tensor, device: torch.device, bf16: bool) -> float:
    """exp(mean next-token cross-entropy) over the windows, in batches of 16 (as bench_gptq.perplexity)."""
    with torch.no_grad(), autocast(device) if bf16 else nullcontext():
        nll = torch.cat([F.cross_entropy(model(xb.to(device)).double().flatten(0, 1), yb.to(device).flatten(),
                                         reduction="none") for xb, yb in zip(x.split(16), y.split(16), strict=True)])
    return float(torch.exp(nll.mean()))


def gptq(plan: Plan, device: torch.device, guard: Guard) -> dict | None:
    if not guard.ok("gptq stories260K"):
        return None
    try:
        model = load_checkpoint(stories260k_path(), device=device).eval()
    except ImportError as e:  # the gguf package (a wheel to carry where it is not installed)
        return {"skipped": f"{type(e).__name__}: {e}"[:300]}
    ids = bench_gptq.cased_ids()
    (n_eval, t_eval), (n_calib, t_calib) = plan.eval, plan.calib
    x, y = (w[:n_eval, :t_eval] for w in bench_gptq.eval_windows(ids))
    calib = bench_gptq.calib_windows(model, ids, "train", 0)[:n_calib, :t_calib]
    ppl = lambda m, bf16: perplexity(m, x, y, device, bf16)  # noqa: E731
    out = {"model": "stories260K", "eval": f"{n_eval}x{t_eval} tinystories-cased",
           "calib": f"{n_calib}x{t_calib} train split, seed 0", "fp32_ppl": ppl(model, False),
           "bf16_ppl": ppl(model, True), "rows": []}
    for row in plan.gptq_rows:
        if not guard.ok(f"gptq {row}"):
            continue
        wq = WeightQuant(**{"method": "gptq", "bits": 4, **bench_gptq.ROWS[row]})
        sync(device)
        start = time.perf_counter()
        q = quantize_model(model, QuantConfig(weights=wq), calib=calib)
        sync(device)
        seconds = time.perf_counter() - start
        out["rows"].append({"row": row, "weights": wq.to_dict(), "seconds": seconds, "fp32_ppl": ppl(q, False),
                            "bf16_ppl": ppl(q, True)})
        del q
    return out


# -- outputs ------------------------------------------------------------------------------------------------------

def markdown(summary: dict) -> str:
    lines = [f"# Issues 16 and 38 on {summary['device_name']} (bf16 autocast)", "",
             f"torch {summary['torch']}; flash-attn: "
             + (summary["flash_attn"].get("version", "") if summary["flash_attn"]["available"]
                else "not available"), "", "## Diff ÷ Transformer forward throughput (matched parameters)", "",
             "| preset | impl | batch × seq | params T / D | Transformer tok/s | Diff tok/s | Diff ÷ Transformer |",
             "|---|---|---|---|---|---|---|"]
    for r in summary["throughput"]:
        p, t = r["params"], r["tokens_per_s"]
        lines.append(f"| {r['preset']} | {r['impl']} | {r['batch']} × {r['seq_len']} | {p['transformer']:,} / "
                     f"{p['diff']:,} | {t['transformer']:,.0f} | {t['diff']:,.0f} | "
                     f"**{r['ratio_diff_over_transformer']:.3f}** |")
    for s in summary["throughput_skipped"]:
        lines.append(f"| {s['preset']} | {s['impl']} | skipped: {s['reason']} | | | | |")
    ran = {r["preset"]: r["diff_kernel_ran"] for r in summary["throughput"] if r["impl"] == "triton"}
    lines += ["", "sdpa: torch's sdpa alone. triton: Diff attention through the fused Triton kernel (the Transformer "
              f"runs sdpa); the kernel ran: {ran or 'no triton row'}."]
    lines += ["", "## Profiling overhead (Diff; ratios to a plain eager forward over the same batches)", "",
              "| preset | tokens | eager tok/s | hidden ÷ eager | hidden + logits ÷ eager | sdpa ÷ eager | "
              "profiling tok/s (hidden + logits) |", "|---|---|---|---|---|---|---|"]
    for r in summary["profiling"]:
        q, t = r["ratio_to_eager"], r["tokens_per_s"]
        lines.append(f"| {r['preset']} | {r['tokens']:,} | {t['plain_eager']:,.0f} | {q['hidden']:.2f} | "
                     f"**{q['hidden_logits']:.2f}** | {q['plain_sdpa']:.2f} | {t['hidden_logits']:,.0f} |")
    lines += ["", "### Profiling variants (host statistics, sync-free statistics, Triton logit kernel)", "",
              f"Triton logit kernel: {summary['logits_kernel']}; fused Diff kernel: {summary['diff_kernel']}", "",
              "| preset | variant | ÷ eager forward | ÷ sdpa forward | tok/s |", "|---|---|---|---|---|"]
    for r in summary["profiling"]:
        for name in (*PROFILE_VARIANTS, "plain_triton"):  # plain_triton: a forward with the fused Diff kernel
            if name in r["seconds"]:
                lines.append(f"| {r['preset']} | {name} | **{r['ratio_to_eager'][name]:.2f}** | "
                             f"{r['ratio_to_sdpa'][name]:.2f} | {r['tokens_per_s'][name]:,.0f} |")
    lines += ["", "## Training-step throughput (bf16 autocast, sdpa, AdamW)", "",
              "| preset | batch × seq | Transformer tok/s | Diff tok/s | Diff ÷ Transformer |", "|---|---|---|---|---|"]
    for r in summary["training"]:
        t = r["tokens_per_s"]
        lines.append(f"| {r['preset']} | {r['batch']} × {r['seq_len']} | {t['transformer']:,.0f} | {t['diff']:,.0f} "
                     f"| **{r['ratio_diff_over_transformer']:.3f}** |")
    lines += ["", "## Attention alone (bf16, no grad; time ÷ the Transformer's sdpa call)", "",
              "| preset | batch × seq | Diff sdpa path | Diff fused Triton kernel | fastest launch config |",
              "|---|---|---|---|---|"]
    for r in summary["attention"]:
        q, best = r["time_over_transformer"], r["fastest_launch_config"]
        fused = f"{q['diff_fused_kernel']:.2f}" if "diff_fused_kernel" in q else r["fused_kernel"]
        lines.append(f"| {r['preset']} | {r['batch']} × {r['seq_len']} | {q['diff_sdpa']:.2f} | {fused} | "
                     + (f"{best}: {q[best]:.2f} |" if best else "|"))
    if summary.get("traces"):
        lines += ["", "## Traces (events / device kernels per run)", ""]
        lines += [f"* {k}: {v['events']} events, {v['device_kernels']} device kernels"
                  for k, v in summary["traces"].items()]
    g = summary["gptq"]
    lines += ["", "## 4-bit per channel on stories260K", ""]
    if g is None:
        lines.append("Skipped by the time guard.")
    elif "skipped" in g:
        lines.append(f"Skipped: {g['skipped']}")
    else:
        lines += [f"Eval {g['eval']}, calibration {g['calib']}.", "",
                  "| row | ppl fp32 | ppl bf16 | quantize time (s) |", "|---|---|---|---|",
                  f"| float | {g['fp32_ppl']:.4f} | {g['bf16_ppl']:.4f} | |"]
        lines += [f"| {r['row']} | {r['fp32_ppl']:.4f} | {r['bf16_ppl']:.4f} | {r['seconds']:.2f} |" for r in g["rows"]]
    if summary["skipped_by_time_guard"]:
        lines += ["", "Skipped by the time guard: " + ", ".join(s["what"] for s in summary["skipped_by_time_guard"])]
    lines += ["", f"Total {summary['times_s']['total']:.1f} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for perf_gpu.json and perf_gpu.md")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (what CI runs)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds (default: 240, dry run 120)")
    parser.add_argument("--trace", default=None, help="folder for torch-profiler traces and kernel tables")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else FULL
    if args.time_limit is not None:
        plan = dataclasses.replace(plan, time_limit_s=args.time_limit)
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(NO_CUDA)
    device = torch.device(plan.device)
    guard = Guard(plan.time_limit_s)
    torch.manual_seed(0)
    flash = flash_status()
    times = {}
    start = time.perf_counter()
    diff_kernel = diff_kernel_status(device, {*plan.shapes, *plan.profile_tokens})
    tp, tp_skipped = throughput(plan, device, guard, flash, diff_kernel)
    times["throughput"] = time.perf_counter() - start
    kernel = kernel_status(device)
    prof = profiling(plan, device, guard, kernel, diff_kernel)
    times["profiling"] = time.perf_counter() - start - sum(times.values())
    train = training(plan, device, guard)
    times["training"] = time.perf_counter() - start - sum(times.values())
    attention = attention_rows(plan, device, guard, diff_kernel)
    times["attention"] = time.perf_counter() - start - sum(times.values())
    gq = gptq(plan, device, guard)
    times["gptq"] = time.perf_counter() - start - sum(times.values())
    traced = traces(plan, device, Path(args.trace), kernel, diff_kernel) if args.trace and guard.ok("traces") else None
    times["total"] = guard.elapsed()
    summary = {
        "benchmark": "issues 16 and 38 on the GPU: Diff/Transformer throughput, profiling overhead, attention, "
                     "training steps, GPTQ on stories260K",
        "dry_run": args.dry_run, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "flash_attn": flash, "dtype": "bf16 autocast",
        "plan": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(plan).items()},
        "throughput": tp, "throughput_skipped": tp_skipped, "profiling": prof, "logits_kernel": kernel,
        "diff_kernel": diff_kernel,
        "training": train, "attention": attention, "gptq": gq, "traces": traced,
        "skipped_by_time_guard": guard.skipped, "times_s": times,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "perf_gpu.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    (out / "perf_gpu.md").write_text(markdown(summary))
    print(markdown(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
