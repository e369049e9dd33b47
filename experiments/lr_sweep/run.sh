#!/usr/bin/env bash
# LR sweep of outlier regime part 1: xs Transformer / Diff pairs on the stories260K teacher corpus,
# 3 peak learning rates x 2 seeds, ~6M tokens each, wsd schedule (last 20% decays), outliers tracked.
#   bash experiments/lr_sweep/run.sh &  bash experiments/lr_sweep/run.sh &     # one worker per core
# Workers share one queue (seed 0 first): each claims the next run nobody has claimed in this boot.
# Resumable: a rerun continues unfinished runs from their state/ and skips finished ones. If the corpus
# shards are missing, regenerate them first with the command in the corpus's manifest.json.
# The same protocol serves other grids: RUNS, SEEDS, LRS and ARCHS override the defaults (see
# experiments/campaign/short.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
DQ=${DQ:-.venv/bin/diffquant}
CORPUS=experiments/corpus/stories260k-s0
TOKENS=${TOKENS:-6029312}  # 736 steps of 16 x 512
# the corpus's shards are parked in main's history (experiments/corpus/README.md): bring them back once
[ -f "$CORPUS/shard_00002.bin" ] || bash experiments/campaign/restore_states.sh "$CORPUS"
RUNS=${RUNS:-experiments/lr_sweep/runs}
CLAIMS=${CLAIMS:-/tmp/diffquant-claims-$(echo "$RUNS" | tr / -)}
NICE=${NICE:-10}
mkdir -p "$RUNS" "$CLAIMS"
for seed in ${SEEDS:-0 1}; do
  for lr in ${LRS:-1e-3 3e-3 1e-2}; do
    for arch in ${ARCHS:-transformer diff}; do
      name=$arch-lr$lr-s$seed
      out=$RUNS/$name
      [ -f "$out/final/config.json" ] && continue
      mkdir "$CLAIMS/$name" 2>/dev/null || continue  # another worker has it
      resume=(); [ -f "$out/state/trainer.json" ] && resume=(--resume)
      echo "$(date -u +%H:%M:%S) start: $out ${resume[*]}"
      nice -n "$NICE" "$DQ" train --arch "$arch" --preset xs --data "$CORPUS" --tokens "$TOKENS" --out "$out" \
        --batch-size 16 --seq-len 512 --recipe stories260k --lr "$lr" --seed "$seed" \
        --schedule wsd --cooldown-frac 0.2 --warmup-steps 50 --eval-every 92 --eval-tokens 65536 \
        --track-every 46 --save-every 46 --threads 1 "${resume[@]}" >> "$out.log" 2>&1 || { echo "failed: $out (see $out.log; a diverged run is recorded in its train_log.json)"; continue; }
      rm -rf "$out/state"  # finished: the final checkpoint and the log are what the summary reads
      echo "$(date -u +%H:%M:%S) done: $out"
    done
  done
done
