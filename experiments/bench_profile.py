"""Cost of profiling, side by side in one run (not a timed test).

    python experiments/bench_profile.py [--preset small] [--tokens 16384] [--memory-tokens 10000 1000000]
                                        [--parts time,memory,long] [--threads N] [--baseline-stats FILE]
                                        [--variants b_hidden,c_hidden_logits,...]

Part 1, time (same model, same batches, alternating repeats; ratios to (a)):
  (a) plain eager forward, (b) profiling hidden states only, (c) hidden states + attention logits,
  (d) the naive baseline: store every activation (float64, as massive-activations does), then sort;
  (b) and (c) again with the sync-free statistics (profile(sync_free=True), the default off the CPU);
  with --baseline-stats (e.g. an older diffquant/stats.py from `git show REV:diffquant/stats.py > old.py`),
  (b) and (c) again with that file's SiteStats, so a change is measured against its baseline in the same run.
Part 2, peak memory (each measurement in a fresh subprocess, ru_maxrss) at two token counts on the tiny
preset: diffquant's streaming profiler should stay flat, the naive baseline grows with the data.
Part 3, long inputs: one 8K-token sequence profiled with query-chunked eager attention.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from diffquant import ModelConfig, build_model, hooked
from diffquant.profile import profile, token_batches


def naive_profile(model, batches, sites=("hidden", "attn_logits"), topk=100) -> dict:
    """massive-activations style: keep float64 copies of every (masked) |value|, sort at the end."""
    kept = {s: [] for s in sites}

    def grab(name, probe, x, call):
        mask = probe.causal_mask(x, call.q_offset)
        vals = x.detach().double().abs()
        kept[probe.kind].append(vals[mask.expand_as(vals)] if mask is not None else vals.flatten())

    with torch.no_grad(), hooked(model, grab, kinds=sites):
        for ids in batches:
            model(ids)
    out = {}
    for kind, parts in kept.items():
        allv = torch.cat(parts).sort(descending=True).values
        out[kind] = {"top": allv[:topk].tolist(), "median": allv.median().item()}
    return out


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def with_stats(site_stats, fn):
    """Run ``fn`` with diffquant.profile using ``site_stats`` as its SiteStats class."""
    module = sys.modules["diffquant.profile"]

    def run():
        saved, module.SiteStats = module.SiteStats, site_stats
        try:
            fn()
        finally:
            module.SiteStats = saved
    return run


def load_site_stats(path: str):
    spec = importlib.util.spec_from_file_location("diffquant.baseline_stats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SiteStats


def time_part(preset: str, tokens: int, repeats: int, baseline: str | None = None,
              only: list[str] | None = None) -> dict:
    cfg = ModelConfig.preset(preset, arch="diff", attn_impl="eager")
    model = build_model(cfg, seed=0).eval()
    batches = token_batches(torch.randint(0, cfg.vocab_size, (tokens,)), cfg.max_seq_len, 8)

    def plain():
        with torch.no_grad():
            for ids in batches:
                model(ids)

    variants = {
        "a_plain": plain,
        "b_hidden": lambda: profile(model, batches, sites=("hidden",), progress=False),
        "c_hidden_logits": lambda: profile(model, batches, sites=("hidden", "attn_logits"), progress=False),
        "d_naive": lambda: naive_profile(model, batches),
        # the same with the statistics kept on the device (stats_device; the default off the CPU)
        "b_hidden_syncfree": lambda: profile(model, batches, sites=("hidden",), progress=False, sync_free=True),
        "c_hidden_logits_syncfree": lambda: profile(model, batches, sites=("hidden", "attn_logits"),
                                                    progress=False, sync_free=True),
    }
    if baseline:
        old = load_site_stats(baseline)
        variants["b_hidden_baseline"] = with_stats(old, variants["b_hidden"])
        variants["c_hidden_logits_baseline"] = with_stats(old, variants["c_hidden_logits"])
    if only:  # a_plain stays: every ratio is to it
        variants = {k: v for k, v in variants.items() if k == "a_plain" or k in only}
    times = {k: [] for k in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"preset": preset, "tokens": tokens, "seconds": med,
            "ratio_to_plain": {k: v / med["a_plain"] for k, v in med.items()}}


def memory_child(kind: str, tokens: int) -> None:
    cfg = ModelConfig.preset("tiny", arch="diff")
    model = build_model(cfg, seed=0).eval()
    ids = torch.randint(0, cfg.vocab_size, (tokens,))
    batches = token_batches(ids, cfg.max_seq_len, 16)
    if kind == "diffquant":
        profile(model, batches, progress=False)
    elif kind == "naive":
        naive_profile(model, batches)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def memory_part(token_counts: list[int]) -> dict:
    out = {}
    for kind in ("baseline", "diffquant", "naive"):
        for tokens in token_counts:
            run = subprocess.run([sys.executable, __file__, "--memory-child", kind, str(tokens)],
                                 capture_output=True, text=True, check=True)
            out[f"{kind}@{tokens}"] = int(run.stdout.strip().splitlines()[-1]) / 1024  # MiB
    return out


def long_part(tokens: int, chunk: int) -> dict:
    cfg = ModelConfig.preset("small", arch="diff", max_seq_len=tokens)
    model = build_model(cfg, seed=0).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, tokens))
    start = time.perf_counter()
    report = profile(model, [ids], chunk=chunk, progress=False)
    return {"tokens": tokens, "chunk": chunk, "seconds": time.perf_counter() - start,
            "logits_counted": report.sites["attn_logits"]["count"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-tokens", type=int, nargs=2, default=[10_000, 1_000_000])
    parser.add_argument("--long-tokens", type=int, default=8192)
    parser.add_argument("--parts", default="time,memory,long", help="which parts to run (comma-separated)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--baseline-stats", default=None, help="a stats.py whose SiteStats to time beside ours")
    parser.add_argument("--variants", default=None, help="time only these (comma-separated, e.g. "
                        "c_hidden_logits,c_hidden_logits_syncfree); the plain forward always runs")
    parser.add_argument("--memory-child", nargs=2, metavar=("KIND", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    parts, record = args.parts.split(","), {"threads": torch.get_num_threads()}
    # memory first: Linux keeps ru_maxrss across fork+exec, so children must start from a small parent
    if "memory" in parts:
        record["memory_mib"] = m = memory_part(args.memory_tokens)
        for name, mib in m.items():
            print(f"peak memory {name:22s} {mib:8.0f} MiB")
    if "time" in parts:
        record["time"] = t = time_part(args.preset, args.tokens, args.repeats, args.baseline_stats,
                                       args.variants.split(",") if args.variants else None)
        for name, ratio in t["ratio_to_plain"].items():
            print(f"time {name:16s} {t['seconds'][name]:7.2f} s   x{ratio:5.2f} of plain")
    if "long" in parts:
        record["long"] = lp = long_part(args.long_tokens, 512)
        print(f"long input: {lp['tokens']} tokens, chunk {lp['chunk']}: {lp['seconds']:.1f} s, "
              f"{lp['logits_counted']} logits counted, peak {lp['peak_rss_mib']:.0f} MiB")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
