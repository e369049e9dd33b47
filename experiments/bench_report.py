"""`diffquant report` on a synthetic records file: time of loading and rendering (bootstrap intervals), with the
bootstrap resample counts kept between statistics over the same units (the default) and drawn again for each
statistic (as before issue 42), printed side by side; the two tables must be identical.

    python experiments/bench_report.py [--windows 5000] [--schemes 4] [--n-boot 10000]

Records: a Transformer and a Diff model, 16 bits plus 8/6/4 bits under each of ``--schemes`` logit-quantization
schemes, one perplexity task of ``--windows`` windows (random losses). Nothing is written outside a temporary
folder.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from diffquant import paired
from diffquant.records import load_records
from diffquant.report import render_report

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "records.jsonl"
GRANULARITIES = ("sequence", "head", "token", "tensor-x")


def synthetic_records(path: Path, windows: int, schemes: int, seed: int = 0) -> Path:
    base = json.loads(FIXTURE.read_text().splitlines()[0])
    rng = np.random.default_rng(seed)
    with path.open("w") as fh:
        for arch in ("transformer", "diff"):
            nll16 = rng.normal(300, 10, windows)
            cells = [(16, None)] + [(b, g) for g in GRANULARITIES[:schemes] for b in (8, 6, 4)]
            for bits, gran in cells:
                nll = nll16 + (0 if bits == 16 else rng.normal(16 - bits, 1, windows))
                metrics = dict(base["metrics"], window_losses=[[float(x), 32] for x in nll], windows=windows,
                               windows_total=windows, window_ids=list(range(windows)), tokens=32 * windows)
                metrics["loss"] = float(nll.sum() / (32 * windows))
                metrics["perplexity"] = float(np.exp(metrics["loss"]))
                rec = dict(base, checkpoint=f"tiny-{arch}", label=f"tiny-{arch}", arch=arch, bits=bits,
                           target=None if bits == 16 else "attn_logits", granularity=gran,
                           model=dict(base["model"], arch=arch), metrics=metrics)
                fh.write(json.dumps(rec) + "\n")
    return path


def timed(records_file: Path, n_boot: int, cache_bytes: int) -> tuple[float, float, str]:
    paired.COUNT_CACHE_BYTES = cache_bytes
    paired._kept_counts.cache_clear()
    start = time.perf_counter()
    records = load_records([records_file])
    loaded = time.perf_counter()
    text = render_report(records, n_boot=n_boot)
    return loaded - start, time.perf_counter() - loaded, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=5000)
    parser.add_argument("--schemes", type=int, default=4, choices=range(1, len(GRANULARITIES) + 1))
    parser.add_argument("--n-boot", type=int, default=10000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        file = synthetic_records(Path(tmp) / "records.jsonl", args.windows, args.schemes)
        size = file.stat().st_size / 2**20
        load_new, render_new, shared = timed(file, args.n_boot, 256 << 20)
        load_old, render_old, redrawn = timed(file, args.n_boot, 0)
    assert shared == redrawn, "sharing the resamples changed the report"
    print(f"{size:.1f} MB records, {args.windows} windows per record, n_boot {args.n_boot}")
    print(f"{'':24}{'redrawn':>10}{'shared':>10}{'ratio':>8}")
    print(f"{'load (s)':24}{load_old:10.2f}{load_new:10.2f}{load_old / load_new:8.2f}")
    print(f"{'render (s)':24}{render_old:10.2f}{render_new:10.2f}{render_old / render_new:8.2f}")


if __name__ == "__main__":
    main()
