#!/usr/bin/env bash
# The long pair of the outlier-regime campaign (issue 13), one size (PRESET, default xs) and seed (SEED, default
# 0): both arms at once (one core each, identical data order), lr 3e-3 held constant after warm-up to 30,720
# steps (251.7M tokens), a resumable branch every 4,096 steps (33.6M tokens) for cooldowns
# (experiments/campaign/cooldown.sh).
# Resumable: rerun to continue from state/.
#   [SEED=1] [PRESET=s] nohup bash experiments/campaign/long.sh > /dev/null 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
DQ=${DQ:-.venv/bin/diffquant}
SEED=${SEED:-0}
PRESET=${PRESET:-xs}
RUN=${RUN:-experiments/campaign/long/$PRESET-lr3e-3-s$SEED}
mkdir -p "$RUN"
for arch in transformer diff; do
  out=$RUN/$arch
  [ -f "$out/final/model.safetensors" ] && continue
  resume=(); [ -f "$out/state/trainer.json" ] && resume=(--resume)
  nice -n "${NICE:-15}" "$DQ" train --arch "$arch" --preset "$PRESET" --data experiments/corpus/stories260k-s0 \
    --tokens 251658240 --out "$out" --batch-size 16 --seq-len 512 --recipe stories260k --lr 3e-3 --seed "$SEED" \
    --schedule constant --warmup-steps 50 --eval-every 512 --eval-tokens 65536 --track-every 128 \
    --save-every 128 --branch-every 4096 --threads 1 "${resume[@]}" >> "$out.log" 2>&1 &
done
wait
