"""Data-parallel scaling on this machine: 1 vs N ranks (torchrun, gloo, one CPU thread per rank), side by side.

    python experiments/scaling/bench_scaling.py [--preset small] [--arch diff] [--tokens 16384] [--ranks 1 2]

For each rank count it launches ``torchrun --nproc-per-node N`` on this same script (``--worker``). Every rank
builds the same seeded model, then times two collective jobs:

* **profile**: ``dq.profile`` over ``--tokens`` tokens (windows of max_seq_len, batches of 4) — attention logits
  and hidden states, exact top-100 with locations;
* **score**: rolling perplexity of the same tokens (``score_requests``, the sweep's and evaluation's engine).

Each rank reports its wall time per job and its peak resident memory (``ru_maxrss``); the table shows the
slowest rank's time (what the run waits for), the largest peak, the speed-up against 1 rank, and whether the
merged profile JSON and perplexity are identical to the 1-rank run (they must be).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _worker(args) -> None:
    import diffquant as dq
    from diffquant import distributed
    from diffquant.evaluate import rolling_perplexity
    from diffquant.profile import token_batches

    torch.set_num_threads(1)
    distributed.init()
    try:
        cfg = dq.ModelConfig.preset(args.preset, arch=args.arch)
        model = dq.build_model(cfg, seed=0).eval()
        ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0))
        batches = token_batches(ids, cfg.max_seq_len, 4)
        start = time.perf_counter()
        report = dq.profile(model, batches, progress=False)
        t_profile = time.perf_counter() - start
        start = time.perf_counter()
        ppl = rolling_perplexity(model, ids, batch_size=4, progress=False)["perplexity"]
        t_score = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out = {"rank": distributed.rank(), "profile_s": t_profile, "score_s": t_score, "peak_mib": peak_mib,
               "profile_sha256": hashlib.sha256(report.to_json().encode()).hexdigest(), "perplexity": ppl}
        Path(args.out, f"rank{distributed.rank()}.json").write_text(json.dumps(out))
    finally:
        distributed.finish()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(n: int, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port",
               str(_free_port()), __file__, "--worker", "--out", tmp, "--preset", args.preset, "--arch", args.arch,
               "--tokens", str(args.tokens)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DIFFQUANT_DIST_BACKEND": "gloo"}
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        total = time.perf_counter() - start
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
    return [{**r, "launch_s": total} for r in ranks]


def _table(results: dict[int, list[dict]]) -> str:
    base = results[min(results)]
    t1 = {k: max(r[k] for r in base) for k in ("profile_s", "score_s", "launch_s")}
    lines = ["| ranks | profile s (speed-up) | score s (speed-up) | whole run s | peak MiB per rank | "
             "same profile JSON | same perplexity |", "|---|---|---|---|---|---|---|"]
    for n, ranks in sorted(results.items()):
        slow = {k: max(r[k] for r in ranks) for k in t1}
        same = all(r["profile_sha256"] == base[0]["profile_sha256"] for r in ranks)
        ppl = all(r["perplexity"] == base[0]["perplexity"] for r in ranks)
        peaks = ", ".join(f"{r['peak_mib']:.0f}" for r in ranks)
        lines.append(f"| {n} | {slow['profile_s']:.1f} ({t1['profile_s'] / slow['profile_s']:.2f}×) | "
                     f"{slow['score_s']:.1f} ({t1['score_s'] / slow['score_s']:.2f}×) | {slow['launch_s']:.1f} | "
                     f"{peaks} | {same} | {ppl} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--arch", default="diff")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args)
        return
    results = {n: _launch(n, args) for n in args.ranks}
    load = os.getloadavg()[0]
    print(f"{args.preset} {args.arch}, {args.tokens} tokens, {os.cpu_count()} CPUs, load average {load:.1f} "
          f"at the end, one thread per rank, gloo")
    print(_table(results))


if __name__ == "__main__":
    main()
