"""llama.cpp's perplexity on our GGUF exports of stories260K against ours, on the same token windows.

    experiments/llamacpp/setup.sh                       # builds llama-cpp-python into experiments/llamacpp/.venv
    OMP_NUM_THREADS=1 python experiments/llamacpp/compare.py [--windows 16] [--window 256]

Files (written to --work, default a temporary folder), all Llama GGUF files from ``diffquant.gguf_export``:

* ``f32``: the float model; ``q8_0-llamacpp`` / ``q4_0-llamacpp``: our export rounded by llama.cpp's block
  rounding (gguf.quants, the port of quantize_row_q*_ref), on our quantized set;
* ``q8_0-llama-quantize`` / ``q4_0-llama-quantize``: llama.cpp's own quantizer (``llama_model_quantize``, what
  the llama-quantize tool runs) on the f32 file, with its default tensor-type mixture — what a llama.cpp user
  gets. Every block tensor it writes is compared byte for byte with gguf.quants' rounding of the same weights;
* ``q8_0-rtn`` (RTN int8, group 32), ``q4_0-rtn`` (RTN int4 absmax ±7, group 32), ``q4_0-gptq`` (GPTQ int4,
  full grid, group 32): our codes and float16 scales written exactly (the packed checkpoint ``diffquant
  quantize`` would write, read back).

The quantized set is the same everywhere: the block Linear layers whose rows split into blocks of 32 (ffn_down,
172 columns, stays float in all of them, as llama.cpp's converter leaves it unquantized too). "ours" is
diffquant's perplexity (float64 cross-entropy) of the model each file describes — the quantized model itself
for our codes, the file's dequantized weights for llama.cpp's rounding; "llama.cpp" is llama-cpp-python
evaluating the file. Each window (W+1 tokens of the cased TinyStories sample, contiguous) starts from an empty
cache and scores W targets. Results: experiments/results/llamacpp.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from diffquant.calibration import calibration_batch
from diffquant.checkpoint import load_checkpoint, save_quantized
from diffquant.checkpoint.gguf import stories260k_path, stories260k_tokenizer_path
from diffquant.data import encode_documents, load_documents
from diffquant.ggml_blocks import BLOCK_TYPES, llamacpp_quantize
from diffquant.gguf_export import save_gguf
from diffquant.io import dump_json
from diffquant.quant import QuantConfig, WeightQuant
from diffquant.quant.api import default_filter, quantize
from diffquant.tokenizer import Tokenizer

HERE = Path(__file__).resolve().parent
VENV_PYTHON = HERE / ".venv" / "bin" / "python"
RESULTS = HERE.parent / "results"
OURS = {  # name -> (gguf type, weight scheme)
    "q8_0-rtn": ("q8_0", WeightQuant("rtn", bits=8, group_size=32)),
    "q4_0-rtn": ("q4_0", WeightQuant("rtn", bits=4, group_size=32)),
    "q4_0-gptq": ("q4_0", WeightQuant("gptq", bits=4, group_size=32)),
}
CALIB_WINDOWS, CALIB_LEN = 64, 256


def blocks_of_32(name: str, module) -> bool:
    """The block Linears llama.cpp can block-quantize (rows a multiple of 32 columns)."""
    return default_filter(name, module) and module.in_features % 32 == 0


def eval_windows(tokenizer: Tokenizer, n: int, window: int) -> torch.Tensor:
    ids = torch.from_numpy(encode_documents(tokenizer, load_documents("tinystories-cased")).astype(np.int64))
    if len(ids) < n * window + 1:
        raise SystemExit(f"the sample holds {len(ids)} tokens, fewer than {n} windows of {window}")
    return torch.stack([ids[i * window: i * window + window + 1] for i in range(n)])  # (N, W+1)


def our_perplexity(model, windows: torch.Tensor) -> dict:
    with torch.inference_mode():
        logits = model(windows[:, :-1]).double()  # (N, W, V)
        nll = float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="sum"))
    tokens = windows[:, 1:].numel()
    return {"nll": nll, "tokens": tokens, "perplexity": math.exp(nll / tokens)}


def calibration(tokenizer: Tokenizer, seed: int = 0) -> torch.Tensor:
    """GPTQ calibration windows from the calib train split, by ``diffquant quantize``'s rule."""
    return calibration_batch(tokenizer, CALIB_LEN, CALIB_WINDOWS * CALIB_LEN, seed)


def our_quantized(model, wq: WeightQuant, calib, folder: Path):
    """The quantized model as a packed checkpoint stores it (float16 scales), read back."""
    qmodel = quantize(model, QuantConfig(weights=wq), calib=calib if wq.method == "gptq" else None,
                      filter_fn=blocks_of_32)
    save_quantized(qmodel, folder, overwrite=True, dtype=torch.float16)
    return load_checkpoint(folder)


def llama_quantize(src: Path, dst: Path, kind: str, python: Path = VENV_PYTHON) -> Path:
    subprocess.run([str(python), str(HERE / "llamacpp_quantize.py"), str(src), str(dst), kind], check=True,
                   capture_output=True)
    return dst


def tensor_types(path: Path) -> dict[str, str]:
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def block_agreement(f32_file: Path, quantized_file: Path) -> dict:
    """llama.cpp's quantizer against gguf.quants' rounding: its block tensors, byte for byte."""
    from gguf import GGUFReader

    floats = {t.name: np.asarray(t.data) for t in GGUFReader(f32_file).tensors}
    equal, compared = [], []
    for t in GGUFReader(quantized_file).tensors:
        if t.tensor_type.name in BLOCK_TYPES:
            compared.append(t.name)
            ours = llamacpp_quantize(floats[t.name], t.tensor_type.name)
            if np.array_equal(ours.reshape(-1), np.asarray(t.data).reshape(-1)):
                equal.append(t.name)
    return {"tensors_compared": len(compared), "tensors_equal": len(equal),
            "different": sorted(set(compared) - set(equal))}


def build_files(work: Path, model, tokenizer: Tokenizer,
                python: Path = VENV_PYTHON) -> tuple[dict[str, Path], dict[str, dict], dict[str, dict]]:
    """Every GGUF file of the comparison, our perplexity source for each (a model), and the byte comparison of
    llama.cpp's quantizer with gguf.quants' rounding."""
    source = stories260k_path()
    files, models, agreement = {}, {}, {}
    for name, kind in (("f32", "f32"), ("q8_0-llamacpp", "q8_0"), ("q4_0-llamacpp", "q4_0")):
        files[name] = work / f"{name}.gguf"
        save_gguf(model, files[name], kind, vocab_from=source, overwrite=True)
        models[name] = load_checkpoint(files[name])  # its weights as llama.cpp reads them (dequantized)
    for kind in ("q8_0", "q4_0"):
        name = f"{kind}-llama-quantize"
        files[name] = llama_quantize(files["f32"], work / f"{name}.gguf", kind, python)
        models[name] = load_checkpoint(files[name])
        agreement[name] = block_agreement(files["f32"], files[name])
    calib = calibration(tokenizer)
    for name, (kind, wq) in OURS.items():
        models[name] = our_quantized(model, wq, calib, work / f"{name}-packed")
        files[name] = work / f"{name}.gguf"
        save_gguf(models[name], files[name], kind, vocab_from=source, overwrite=True)
    return files, models, agreement


def llamacpp_perplexities(files: dict[str, Path], windows: torch.Tensor, work: Path,
                          python: Path = VENV_PYTHON) -> dict:
    windows_file, out_file = work / "windows.json", work / "llamacpp.json"
    windows_file.write_text(json.dumps({"windows": windows.tolist()}))
    subprocess.run([str(python), str(HERE / "llamacpp_ppl.py"), str(windows_file), str(out_file),
                    *map(str, files.values())], check=True)
    raw = json.loads(out_file.read_text())
    by_path = raw["models"]
    return {"version": raw["llama_cpp_python"], "models": {n: by_path[str(p)] for n, p in files.items()}}


def run(n_windows: int = 16, window: int = 256, work: Path | None = None, python: Path = VENV_PYTHON) -> dict:
    torch.manual_seed(0)
    tokenizer = Tokenizer.load(stories260k_tokenizer_path())
    model = load_checkpoint(stories260k_path())
    windows = eval_windows(tokenizer, n_windows, window)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        files, models, agreement = build_files(work, model, tokenizer, python)
        start = time.perf_counter()
        theirs = llamacpp_perplexities(files, windows, work, python)
        llama_seconds = time.perf_counter() - start
        rows = {name: {"file": files[name].name, "bytes": files[name].stat().st_size,
                       "tensor_types": type_counts(tensor_types(files[name])),
                       "ours": our_perplexity(models[name], windows), "llama_cpp": theirs["models"][name]}
                for name in files}
    build = HERE / ".venv" / "build.json"
    return {"model": "stories260K", "windows": n_windows, "window": window, "tokens": n_windows * window,
            "data": "tinystories-cased (calib), contiguous windows from the start",
            "llama_cpp_python": theirs["version"], "llama_cpp_seconds": round(llama_seconds, 1),
            "build": json.loads(build.read_text()) if build.is_file() else None, "rows": rows,
            "llama_quantize_vs_gguf_quants": agreement}


def type_counts(types: dict[str, str]) -> dict[str, int]:
    return {kind: sum(1 for t in types.values() if t == kind) for kind in sorted(set(types.values()))}


def codes(name: str) -> str:
    if name == "f32":
        return "float"
    if name.endswith("llama-quantize"):
        return "llama-quantize, its mixture"
    return "llama.cpp rounding, our set" if "llamacpp" in name else "ours, exact"


def markdown(result: dict) -> str:
    lines = [f"# llama.cpp vs diffquant perplexity: {result['model']}", "",
             f"{result['tokens']} tokens ({result['windows']} windows of {result['window']}, {result['data']}); "
             f"llama-cpp-python {result['llama_cpp_python']}"
             + (f", built from source in {result['build']['build_seconds']} s" if result["build"] else "") + ".",
             "Quantized: the block Linears with rows of a multiple of 32 (ffn_down, 172 columns, stays float).", "",
             "| file | codes | tensor types | bytes | ppl (diffquant) | ppl (llama.cpp) | rel. diff |",
             "|---|---|---|---:|---:|---:|---:|"]
    for name, row in result["rows"].items():
        ours, theirs = row["ours"]["perplexity"], row["llama_cpp"]["perplexity"]
        types = ", ".join(f"{k} {n}" for k, n in row["tensor_types"].items())
        lines.append(f"| {row['file']} | {codes(name)} | {types} | {row['bytes']:,} | {ours:.4f} | {theirs:.4f} | "
                     f"{(theirs - ours) / ours:+.2e} |")
    lines.append("")
    for name, a in result["llama_quantize_vs_gguf_quants"].items():
        lines.append(f"{name}: {a['tensors_equal']} of {a['tensors_compared']} block tensors byte-equal to "
                     "gguf.quants' rounding of the same float weights"
                     + (f" (different: {', '.join(a['different'])})" if a["different"] else "") + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--work", type=Path, default=None, help="keep the GGUF files here")
    p.add_argument("--out", type=Path, default=RESULTS / "llamacpp")
    args = p.parse_args(argv)
    if not VENV_PYTHON.is_file():
        sys.exit(f"no llama.cpp binding: run {HERE / 'setup.sh'} first")
    result = run(args.windows, args.window, args.work)
    dump_json(result, args.out.with_suffix(".json"))
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
