"""`diffquant report` on a large synthetic records file, before and after a change, side by side.

    python experiments/bench_report.py [--schemes 9] [--n-boot 1000] [--baseline REV] [--default-n-boot 10000]

Writes a records file (in a temporary folder, removed at the end) as a full sweep of two models would: a
Transformer and a Diff, 16 bits and 8/6/4 bits under ``--schemes`` quantization schemes, each on a
HellaSwag-sized multiple-choice task (10,042 items), a LAMBADA-sized one (5,153 items) and 2,000 perplexity
windows; random losses from a fixed seed, written with the sweep's own record writer. ~140 MB by default.

Each side loads and renders the report (``--format csv``: every number at full precision) in its own process:
"before" is the package as of ``--baseline`` (a git revision, extracted with ``git archive``), "after" this tree.
Printed: wall and CPU seconds of reading and of rendering, peak memory, their ratios, and whether the two
reports are identical; then "after" once more at ``--default-n-boot`` (the command's default). On this 2-core
machine under load, CPU seconds compare better than wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "records.jsonl"
BASELINE = "d29eea6"  # the report before the bootstrap was batched and the records read as arrays
SCHEMES = [("attn_logits", g, None) for g in ("sequence", "head", "token")] + \
          [("attn_probs", g, None) for g in ("sequence", "head", "token")] + \
          [("weights-rtn", None, gs) for gs in (None, 128, 64)]
TASKS = {"hellaswag": 10042, "lambada": 5153, "wikitext2": 2000}  # items, items, windows


# ---------------------------------------------------------------------------------------------------- records

def write_records(path: Path, schemes: int, seed: int = 0) -> Path:
    from diffquant.records import append_record

    templates = {}
    for line in FIXTURE.read_text().splitlines():
        rec = json.loads(line)
        templates.setdefault(rec["kind"], rec)
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 4, TASKS["hellaswag"])
    cells = [(16, None, None, None)] + [(b, *s) for s in SCHEMES[:schemes] for b in (8, 6, 4)]
    with path.open("w") as fh:
        for arch in ("transformer", "diff"):
            for bits, target, granularity, group_size in cells:
                loss = 0.0 if bits == 16 else (16 - bits) * 0.5  # fewer bits, larger losses
                common = {"checkpoint": f"bench-{arch}", "label": f"bench-{arch}", "arch": arch, "bits": bits,
                          "target": target, "granularity": granularity, "group_size": group_size, "limit": None,
                          "model": dict(templates["perplexity"]["model"], arch=arch)}
                for kind, task, metrics in (("multiple_choice", "hellaswag", _choice_metrics(rng, gold, loss)),
                                            ("lambada", "lambada", _lambada_metrics(rng, loss)),
                                            ("perplexity", "wikitext2", _window_metrics(rng, loss))):
                    append_record(fh, {**templates[kind], **common, "task": task, "metrics": metrics})
    return path


def _choice_metrics(rng, gold: np.ndarray, loss: float) -> dict:
    n = gold.size
    ll = rng.normal(-60, 15, (n, 4))
    ll[np.arange(n), gold] += 5 - loss
    pred, pred_norm = ll.argmax(1), (ll / rng.integers(3, 30, (n, 4))).argmax(1)
    items = [{"id": i, "gold": int(gold[i]), "predicted": int(pred[i]), "predicted_norm": int(pred_norm[i]),
              "correct": bool(pred[i] == gold[i]), "correct_norm": bool(pred_norm[i] == gold[i]),
              "ll": ll[i].tolist()} for i in range(n)]
    return {"task": "hellaswag", "kind": "multiple_choice", "limit": None, "seed": 0, "n": n,
            "acc": float(np.mean(pred == gold)), "acc_norm": float(np.mean(pred_norm == gold)), "items": items}


def _lambada_metrics(rng, loss: float) -> dict:
    n = TASKS["lambada"]
    ll = rng.normal(-5 - loss, 2, n)
    correct = rng.random(n) < 0.3
    items = [{"id": i, "gold": 0, "correct": bool(correct[i]), "ll": float(ll[i]), "tokens": int(t)}
             for i, t in enumerate(rng.integers(1, 5, n))]
    return {"task": "lambada", "kind": "lambada", "limit": None, "seed": 0, "n": n, "acc": float(correct.mean()),
            "perplexity": float(np.exp(-ll.mean())), "items": items}


def _window_metrics(rng, loss: float) -> dict:
    n = TASKS["wikitext2"]
    nll = rng.normal(1500 + 10 * loss, 80, n)
    tokens = 256 * n
    return {"loss": float(nll.sum() / tokens), "perplexity": float(np.exp(nll.sum() / tokens)), "tokens": tokens,
            "windows": n, "windows_total": n, "max_len": 256, "stride": 256, "window_ids": list(range(n)),
            "window_losses": [[float(x), 256] for x in nll]}


# ---------------------------------------------------------------------------------------------------- timing

def worker(records: str, n_boot: int, out: str) -> None:
    """One side: read and render with the package on PYTHONPATH; times and peak memory as one JSON line."""
    import inspect
    import logging

    from diffquant.records import load_records
    from diffquant.report import render_report

    logging.disable(logging.WARNING)
    imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    compact = {"compact": True} if "compact" in inspect.signature(load_records).parameters else {}
    wall, cpu = time.perf_counter(), time.process_time()
    recs = load_records([records], **compact)
    loaded = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    Path(out).write_text(render_report(recs, "csv", n_boot=n_boot))
    rendered = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"load_wall": loaded[0], "load_cpu": loaded[1], "render_wall": rendered[0],
                      "render_cpu": rendered[1], "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "import_mb": imported}))


def run_side(tree: Path, records: Path, n_boot: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, __file__, "--worker", str(records), str(n_boot), str(out)], env=env,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def extract(rev: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "diffquant"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


ROWS = [("read, wall (s)", "load_wall"), ("read, CPU (s)", "load_cpu"), ("render, wall (s)", "render_wall"),
        ("render, CPU (s)", "render_cpu"), ("peak memory (MB)", "peak_mb"),
        ("  of which imports (MB)", "import_mb")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", type=int, default=len(SCHEMES), choices=range(1, len(SCHEMES) + 1))
    parser.add_argument("--n-boot", type=int, default=1000, help="resamples of the side-by-side runs")
    parser.add_argument("--default-n-boot", type=int, default=10000, help="'after' once more at this (0: skip)")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of 'before'")
    parser.add_argument("--worker", nargs=3, metavar=("RECORDS", "N_BOOT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], int(args.worker[1]), args.worker[2])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("writing the records ...", file=sys.stderr, flush=True)
        records = write_records(tmp / "records.jsonl", args.schemes)
        print(f"before ({args.baseline}) and after, n_boot {args.n_boot} ...", file=sys.stderr, flush=True)
        before = run_side(extract(args.baseline, tmp / "before"), records, args.n_boot, tmp / "before.csv")
        after = run_side(ROOT, records, args.n_boot, tmp / "after.csv")
        same = (tmp / "before.csv").read_bytes() == (tmp / "after.csv").read_bytes()
        lines = len((tmp / "after.csv").read_text().splitlines()) - 1
        default = run_side(ROOT, records, args.default_n_boot, tmp / "default.csv") if args.default_n_boot else None
        size = records.stat().st_size / 1e6
    cells = 1 + 3 * args.schemes
    print(f"{size:.1f} MB records: 2 models x {cells} cells x 3 tasks ({', '.join(map(str, TASKS.values()))} "
          f"items / windows); report of {lines} numbers (csv)")
    print(f"{f'n_boot {args.n_boot}':26}{'before':>10}{'after':>10}{'ratio':>8}")
    for label, key in ROWS:
        print(f"{label:26}{before[key]:10.1f}{after[key]:10.1f}{before[key] / after[key]:8.1f}")
    print(f"reports identical (csv, full precision): {'yes' if same else 'NO'}")
    if default:
        print(f"after at n_boot {args.default_n_boot}: " + ", ".join(f"{label.strip()} {default[key]:.1f}"
                                                              for label, key in ROWS))
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
