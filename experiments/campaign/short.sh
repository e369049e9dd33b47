#!/usr/bin/env bash
# Cheap gated pairs for the outlier-regime verdicts: part 1's lr 1e-2 protocol (xs, ~6M tokens, wsd, 20% decay),
# where the Transformer already passes the gate, for more seeds and for the gated / clipped arms (issue 17).
# Seeds 0 and 1 of transformer / diff are part 1's runs in experiments/lr_sweep/runs.
#   bash experiments/campaign/short.sh &  bash experiments/campaign/short.sh &     # one worker per core
set -euo pipefail
cd "$(dirname "$0")/../.."
export RUNS=experiments/campaign/short LRS=1e-2 NICE=${NICE:-5}
SEEDS=0 ARCHS="gated clipped" bash experiments/lr_sweep/run.sh
SEEDS="2 3 4" ARCHS="transformer diff" bash experiments/lr_sweep/run.sh
