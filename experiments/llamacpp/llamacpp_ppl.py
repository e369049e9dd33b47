"""llama.cpp's perplexity of GGUF files on given token windows; runs in experiments/llamacpp/.venv (llama-cpp-python).

Usage: python llamacpp_ppl.py WINDOWS.json OUT.json MODEL.gguf [MODEL.gguf ...]
WINDOWS.json: {"windows": [[ids of T+1 tokens], ...]}; each window is evaluated from an empty cache, token i
predicts token i+1 (the first token only conditions). OUT.json: {file: {"nll": total nats, "tokens": n,
"perplexity": ..., "seconds": ...}} plus the llama_cpp version. Standalone on purpose: no diffquant import.
"""

import json
import math
import sys
import time

import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_c
import numpy as np


def _plain_cpu_kernels() -> None:
    """Load weights without llama.cpp's extra buffer types (repacked / AMX weights): ggml built with
    GGML_NATIVE on a CPU that reports AMX uses AMX tiles for Q4_0/Q8_0, and a VM that does not grant the tile
    state kills the process with SIGILL (seen here). The plain CPU kernels are llama.cpp's reference numerics."""
    default = llama_cpp_c.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp_c.llama_model_default_params = params


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def perplexity(path: str, windows: list[list[int]]) -> dict:
    n_ctx = max(len(w) for w in windows)
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                          n_threads=1, verbose=False)
    start, nll, count = time.perf_counter(), 0.0, 0
    for w in windows:
        llm.reset()
        llm.eval(w[:-1])
        logp = _log_softmax(np.array(llm.scores[:len(w) - 1]))  # (T, V)
        nll -= float(logp[np.arange(len(w) - 1), w[1:]].sum())
        count += len(w) - 1
    return {"nll": nll, "tokens": count, "perplexity": math.exp(nll / count),
            "seconds": round(time.perf_counter() - start, 2)}


def main(argv: list[str]) -> None:
    _plain_cpu_kernels()
    windows_file, out_file, *models = argv
    with open(windows_file) as fh:
        windows = json.load(fh)["windows"]
    results = {"llama_cpp_python": llama_cpp.__version__, "models": {m: perplexity(m, windows) for m in models}}
    with open(out_file, "w") as fh:
        json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
