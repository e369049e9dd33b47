#!/usr/bin/env bash
# LR sweep of outlier regime part 1: xs Transformer / Diff pairs on the stories260K teacher corpus,
# 3 peak learning rates x 2 seeds, ~6M tokens each, wsd schedule (last 20% decays), outliers tracked.
#   bash experiments/lr_sweep/run.sh [WORKER N_WORKERS]    e.g. run 0 2 and 1 2 at once, one per core
# Resumable: a rerun continues unfinished runs from their state/ and skips finished ones. The corpus is
# regenerated from its seed first if its shards are missing (diffquant sample resumes / redraws).
set -euo pipefail
cd "$(dirname "$0")/../.."
worker=${1:-0}; workers=${2:-1}
DQ=${DQ:-.venv/bin/diffquant}
CORPUS=experiments/corpus/stories260k-s0
TOKENS=${TOKENS:-6029312}  # 736 steps of 16 x 512
mkdir -p experiments/lr_sweep/runs
i=0
for seed in 0 1; do
  for lr in 1e-3 3e-3 1e-2; do
    for arch in transformer diff; do
      i=$((i + 1))
      [ $(( (i - 1) % workers )) -eq "$worker" ] || continue
      out=experiments/lr_sweep/runs/$arch-lr$lr-s$seed
      [ -f "$out/final/model.safetensors" ] && { echo "done: $out"; continue; }
      resume=(); [ -f "$out/state/trainer.json" ] && resume=(--resume)
      echo "$(date -u +%H:%M:%S) start: $out ${resume[*]}"
      nice -n 10 "$DQ" train --arch "$arch" --preset xs --data "$CORPUS" --tokens "$TOKENS" --out "$out" \
        --batch-size 16 --seq-len 512 --recipe stories260k --lr "$lr" --seed "$seed" \
        --schedule wsd --cooldown-frac 0.2 --warmup-steps 50 --eval-every 92 --eval-tokens 65536 \
        --track-every 46 --save-every 46 --threads 1 "${resume[@]}" >> "$out.log" 2>&1 || { echo "failed: $out"; exit 1; }
      rm -rf "$out/state"  # finished: the final checkpoint and the log are what the summary reads
    done
  done
done
