"""Benchmark: in-house GPTQ on stories260K (the shipped real model), quality and time, one setting per row.

Evaluation: the first 64 contiguous 256-token windows of the cased TinyStories sample (stories260K's own
SentencePiece tokenizer, one BOS at the start), perplexity = exp(mean next-token cross-entropy).
Calibration: what `diffquant quantize stories260K.gguf --weights gptq` uses by default, 128 windows of 256 tokens
of the train split drawn with seed 0. 4-bit, per output channel, no act-order; each row changes one thing so
the gap to GPTQModel (4.6118 in issue 16: full grid, damp 0.05, true-sequential) can be attributed.

    OMP_NUM_THREADS=1 python experiments/bench_gptq.py [--rows all|NAME,...] [--seeds 0,1,2] [--threads 1]
                                                       [--gptqmodel] [--profile] [--out rec.json]

``--gptqmodel`` adds GPTQModel 7.7 in the same run, on the same calibration and evaluation windows: the model is
written as a Hugging Face Llama folder under out/gptqmodel/ and experiments/gptqmodel_run.py runs in its own venv
(.venv-gptqmodel/, created on first use: torch 2.14.1 from PyPI, a CUDA build of several GB, plus gptqmodel).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import platform
import pstats
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from diffquant.calibration import gptq_calibration
from diffquant.checkpoint import load_checkpoint
from diffquant.checkpoint.gguf import stories260k_path, stories260k_tokenizer_path
from diffquant.data import encode_documents, load_documents
from diffquant.quant import QuantConfig, WeightQuant, quantize_model
from diffquant.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))

WINDOW, EVAL_WINDOWS, CALIB_TOKENS = 256, 64, 128 * 256
# name -> WeightQuant overrides (method gptq, 4 bits, per channel unless said otherwise)
ROWS = {
    "rtn": dict(method="rtn"),
    "rtn-full": dict(method="rtn", grid="full"),
    "gptq": dict(grid="absmax"),  # the defaults before issue 16: absmax grid, damp 0.01, true-sequential
    "gptq-damp.05": dict(grid="absmax", damp=0.05),
    "gptq-full": dict(grid="full"),  # today's defaults
    "gptq-full-damp.05": dict(grid="full", damp=0.05),  # GPTQModel 7.7's settings
    "gptq-full-damp.05-parallel": dict(grid="full", damp=0.05, sequential=False),
}


def cased_ids() -> torch.Tensor:
    tok = Tokenizer.load(stories260k_tokenizer_path())
    return torch.from_numpy(encode_documents(tok, load_documents("tinystories-cased")).astype(np.int64))


def eval_windows(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = EVAL_WINDOWS * WINDOW
    return ids[:n].view(EVAL_WINDOWS, WINDOW), ids[1:n + 1].view(EVAL_WINDOWS, WINDOW)  # (64, 256) each


def calib_windows(model, ids: torch.Tensor, source: str, seed: int) -> torch.Tensor:
    """The command's default (train split, windows drawn with ``seed``) or the cased sample's windows after the
    evaluation ones."""
    if source == "tinystories":
        start, n = EVAL_WINDOWS * WINDOW, CALIB_TOKENS // WINDOW
        return ids[start:start + n * WINDOW].view(n, WINDOW)
    return gptq_calibration(stories260k_path(), model, CALIB_TOKENS, WINDOW, seed)[0]


ROOT = Path(__file__).resolve().parent.parent
VENV, WORK = ROOT / ".venv-gptqmodel", ROOT / "out" / "gptqmodel"
GPTQMODEL_PACKAGES = ["torch==2.14.1", "gptqmodel==7.7.0"]


def export_hf(model, folder: Path) -> None:
    """stories260K as a transformers Llama folder (rotate-half q/k rows) with a stand-in id-level tokenizer."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from diffquant.checkpoint.hf import to_hf_model

    c = model.config
    to_hf_model(model).save_pretrained(folder)  # the converter the HF round-trip tests check
    vocab = {f"t{i}": i for i in range(3, c.vocab_size)} | {"<unk>": 0, "<s>": 1, "</s>": 2}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # GPTQModel loads a tokenizer; ids are passed directly
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="<unk>").save_pretrained(folder)


def run_gptqmodel(model, calibs: dict, x, y, threads: int) -> list[dict]:
    """GPTQModel on each calibration draw, in its own venv (created here on first use)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *GPTQMODEL_PACKAGES], check=True)
    export_hf(model, WORK / "hf")
    torch.save((x, y), WORK / "eval.pt")
    out = []
    for calib in calibs.values():
        torch.save(calib, WORK / "calib.pt")
        run = subprocess.run([str(python), str(Path(__file__).parent / "gptqmodel_run.py"), str(WORK), str(threads)],
                             capture_output=True, text=True, env={**os.environ, "GPTQMODEL_CPU_WORKERS": "2"},
                             cwd=WORK)  # its log files land there
        if run.returncode:
            raise SystemExit(f"GPTQModel failed:\n{run.stderr[-3000:]}")
        out.append(json.loads(run.stdout.strip().splitlines()[-1]))
    return out


def perplexity(model, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        nll = torch.cat([F.cross_entropy(model(xb).double().flatten(0, 1), yb.flatten(), reduction="none")
                         for xb, yb in zip(x.split(16), y.split(16), strict=True)])
    return float(torch.exp(nll.mean()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="all", help=f"comma-separated of {', '.join(ROWS)}")
    ap.add_argument("--calib", default="train", choices=["train", "tinystories"],
                    help="calibration windows: the quantize command's default (train split) or in-domain text")
    ap.add_argument("--seeds", default="0", help="calibration draws (train split), e.g. 0,1,2: ppl per seed and mean")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gptqmodel", action="store_true", help="also run GPTQModel 7.7 (its own venv) side by side")
    ap.add_argument("--profile", action="store_true", help="cProfile each GPTQ row, print the top 12 entries")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    rows = list(ROWS) if args.rows == "all" else args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows: {', '.join(unknown)}")
    model = load_checkpoint(stories260k_path()).eval()
    ids = cased_ids()
    x, y = eval_windows(ids)
    seeds = [int(s) for s in args.seeds.split(",")]
    calibs = {s: calib_windows(model, ids, args.calib, s) for s in seeds}
    records = [{"row": "fp32", "ppl": perplexity(model, x, y)}]
    print(f"{'fp32':>28}: ppl {records[0]['ppl']:.4f}", flush=True)
    for row in rows:
        wq = WeightQuant(**{"method": "gptq", "bits": 4, **ROWS[row]})
        ppls, times = [], []
        for calib in calibs.values():
            prof = cProfile.Profile() if args.profile and wq.method == "gptq" else None
            start = time.perf_counter()
            if prof:
                prof.enable()
            q = quantize_model(model, QuantConfig(weights=wq), calib=calib)
            if prof:
                prof.disable()
                pstats.Stats(prof).sort_stats("cumulative").print_stats(12)
            times.append(time.perf_counter() - start)
            ppls.append(perplexity(q, x, y))
        records.append({"row": row, "weights": wq.to_dict(), "ppl": ppls, "mean_ppl": float(np.mean(ppls)),
                        "seconds": times})
        each = " ".join(f"{p:.4f}" for p in ppls)
        print(f"{row:>28}: mean ppl {np.mean(ppls):.4f} ({each})  median {np.median(times):5.1f} s", flush=True)
    if args.gptqmodel:
        runs = run_gptqmodel(model, calibs, x, y, args.threads)
        ppls, times = [r["gptqmodel_ppl"] for r in runs], [r["gptqmodel_seconds"] for r in runs]
        records.append({"row": "GPTQModel 7.7", "runs": runs, "ppl": ppls, "mean_ppl": float(np.mean(ppls)),
                        "seconds": times})
        each = " ".join(f"{p:.4f}" for p in ppls)
        print(f"{'GPTQModel 7.7':>28}: mean ppl {np.mean(ppls):.4f} ({each})  median {np.median(times):5.1f} s "
              f"(its fp32 ppl {runs[0]['gptqmodel_fp32_ppl']:.4f})", flush=True)
    result = {"benchmark": "GPTQ 4-bit per channel on stories260K", "threads": args.threads,
              "eval": f"{EVAL_WINDOWS}x{WINDOW} tinystories-cased",
              "calib": f"{CALIB_TOKENS // WINDOW}x{WINDOW} {args.calib}, seeds {seeds}",
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "records": records}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
