"""Benchmark: the cost of dynamic 4-bit attention-logit fake-quantization in one forward (goal ≤ 1.3×).

(a) one eager forward of a model with 4-bit logit fake-quant (per-tensor, per-head, per-row) against the same
    forward without it; median wall time over repeats, ratio printed. Not a timed test: CPU timings here share
    two cores with other jobs, so run it on a quiet machine for numbers worth quoting.
(b) in-house GPTQ against GPTQModel: not run, see NOT_RUN_B.

    python experiments/bench_quant.py [--checkpoint DIR] [--preset small] [--batch 4] [--seq-len 256]
                                      [--repeats 7] [--threads 1] [--device cpu] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import diffquant as dq
from diffquant.quant import ActQuant, QuantConfig, quantize_model

NOT_RUN_B = (
    "GPTQModel 7.7.0 (pip install --no-deps gptqmodel) does not import here: 'import pcre' fails, and its metadata "
    "requires torch>=2.14.1 (the project pins the CPU build of torch 2.13.0) plus 14 packages absent from the venv "
    "(pypcre, logbar, device-smi, tokenicer, defuser, torchao, datasets, pyarrow, dill, threadpoolctl, protobuf>=7, "
    "ninja, maturin); replacing torch in the shared venv for one benchmark is not acceptable. It also needs a "
    "Hugging Face Llama folder, which diffquant cannot export yet (transformers 5.24 cannot load stories260K.gguf: "
    "'Padding_idx must be within num_embeddings')."
)


def time_forward(model: torch.nn.Module, ids: torch.Tensor, repeats: int, device: str) -> list[float]:
    times = []
    with torch.no_grad():
        model(ids)  # warm-up (allocator, dequantized weight caches)
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(ids)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return times


def bench_logits(model, ids, repeats, device) -> dict:
    model = model.set_attn_impl("eager").eval()
    base = time_forward(model, ids, repeats, device)
    record = {"eager_ms": 1000 * statistics.median(base), "quantized": {}}
    for gran in ("sequence", "head", "row"):
        q = quantize_model(model, QuantConfig(logits=ActQuant(4, gran)))
        t = time_forward(q, ids, repeats, device)
        record["quantized"][gran] = {"ms": 1000 * statistics.median(t),
                                     "ratio": statistics.median(t) / statistics.median(base)}
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="a checkpoint to time (default: a random preset model)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="also write the JSON record here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    records = []
    for arch in ("transformer", "diff"):
        if args.checkpoint:
            model = dq.load_checkpoint(args.checkpoint)
            if model.config.arch != arch:
                continue
        else:
            model = dq.build_model(dq.ModelConfig.preset(args.preset, arch=arch), seed=0)
        model = model.to(args.device)
        seq_len = min(args.seq_len, model.config.max_seq_len)
        ids = torch.randint(0, model.config.vocab_size, (args.batch, seq_len), device=args.device)
        records.append({"arch": arch, "batch": args.batch, "seq_len": seq_len,
                        **bench_logits(model, ids, args.repeats, args.device)})
    result = {"benchmark": "logit fake-quant 4-bit, one forward", "goal_ratio": 1.3, "device": args.device,
              "threads": args.threads, "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "records": records, "gptq_vs_gptqmodel": {"run": False, "why": NOT_RUN_B}}
    text = json.dumps(result, indent=2)
    print(text)
    for r in records:
        ratios = ", ".join(f"{g} {v['ratio']:.2f}x" for g, v in r["quantized"].items())
        print(f"{r['arch']:>11}: eager {r['eager_ms']:.1f} ms; with 4-bit logits {ratios}")
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
