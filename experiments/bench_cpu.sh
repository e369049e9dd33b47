#!/usr/bin/env bash
# The CPU benchmarks quoted in results/perf.md (GPTQ, profiling cost, Diff ÷ Transformer forward) and
# results/throughput.md (training step, teacher sampling, denormals), run one after another, outputs kept raw:
# the pages quote these numbers together with the machine's load, which this script records beside them.
#   bash experiments/bench_cpu.sh OUT        (OUT/perf.txt, OUT/throughput.txt; ~30-60 min on 2 idle cores)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: bench_cpu.sh OUT" >&2; exit 2; }
out=$1; mkdir -p "$out"
PY=${PY:-.venv/bin/python}
CKPT=${CKPT:-experiments/campaign/long/xs-lr3e-3-s0/cooldown/transformer-step004096/final}
run() {  # run a benchmark, its command line and the load before it into the file $1
  local file=$1; shift
  { echo "\$ $*"; echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"; "$@"; echo; } >> "$file" 2>&1
}
: > "$out/perf.txt"; : > "$out/throughput.txt"
run "$out/perf.txt" "$PY" experiments/bench_gptq.py --seeds 0,1,2
run "$out/perf.txt" "$PY" experiments/bench_profile.py --parts time --threads 1
run "$out/perf.txt" "$PY" experiments/bench_attention.py --impls sdpa --threads 1 --repeats 11
run "$out/throughput.txt" "$PY" experiments/bench_train.py --preset xs s --batch 8 32
run "$out/throughput.txt" "$PY" experiments/bench_sample.py
run "$out/throughput.txt" "$PY" experiments/bench_denormal.py "$CKPT" --steps 3
echo "wrote $out/perf.txt and $out/throughput.txt"
