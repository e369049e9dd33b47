#!/usr/bin/env bash
# Issue 38's GPU check in one call of at most 9 minutes: perf_gpu.py (Diff ÷ Transformer forward with sdpa, the
# fused Triton Diff kernel and flash; the profiler variants; training steps; attention alone with the kernel's
# launch configurations; traces), then the Triton kernels' tests on the GPU. Outputs under OUT (at most 8 files,
# as the device tool brings back): env.txt, perf_gpu.md, perf_gpu.json, perf_gpu.log, trace_tables.tgz,
# pytest_kernels.txt. Run from anywhere; the exact device call is in experiments/gpu/README.md.
#   bash experiments/gpu/speed_window.sh OUT
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: speed_window.sh OUT" >&2; exit 2; }
mkdir -p "$1" && out=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
trace=$(mktemp -d)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/env.txt" 2>&1
# --time-limit: no measurement starts after 200 s; timeout: the hard stop, leaving the tests their 170 s
timeout 330 "$PY" experiments/gpu/perf_gpu.py --out "$out" --trace "$trace" --time-limit 200 > "$out/perf_gpu.log" 2>&1
echo "perf_gpu.py exit $?" >> "$out/env.txt"
(cd "$trace" && tar czf "$out/trace_tables.tgz" -- *.txt) 2>> "$out/env.txt"  # the per-kernel tables, not the JSON
timeout 170 "$PY" -m pytest tests/kernels -p no:cacheprovider -rs > "$out/pytest_kernels.txt" 2>&1
echo "pytest tests/kernels exit $?" >> "$out/env.txt"
cat "$out/env.txt"
tail -n 3 "$out/pytest_kernels.txt"
