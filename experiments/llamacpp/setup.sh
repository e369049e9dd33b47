#!/usr/bin/env bash
# Build llama.cpp's Python binding (llama-cpp-python, compiled from source with gcc + cmake) in its own venv,
# experiments/llamacpp/.venv (gitignored), so nothing it pulls touches the project's environment.
# Usage: experiments/llamacpp/setup.sh [VERSION]   (log: experiments/llamacpp/build.log; ~10+ min on 2 cores)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${1:-0.3.36}"
python="${PYTHON:-python3.11}"
"$python" -m venv "$here/.venv"
"$here/.venv/bin/pip" install -q --upgrade pip
# CPU only; no llava/mtmd (not needed for perplexity), native SIMD for this machine.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
start=$(date +%s)
"$here/.venv/bin/pip" install --no-binary llama-cpp-python "llama-cpp-python==$version" numpy
end=$(date +%s)
echo "{\"llama_cpp_python\": \"$version\", \"build_seconds\": $((end - start))}" > "$here/.venv/build.json"
"$here/.venv/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
