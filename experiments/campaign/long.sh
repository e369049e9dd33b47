#!/usr/bin/env bash
# The long pair of the outlier-regime campaign (issue 13), one size (PRESET, default xs) and seed (SEED, default
# 0): both arms at once (one core each, identical data order), peak lr LR (default 3e-3; the run is PRESET-lrLR-sSEED)
# held constant after warm-up to 30,720 steps (251.7M tokens), a resumable branch every 4,096 steps (33.6M tokens)
# for cooldowns (experiments/campaign/cooldown.sh).
# Resumable: rerun to continue from state/. UNTIL=N stops both arms after step N (a branch step: then cool it).
#   [SEED=1] [PRESET=s] [UNTIL=16384] nohup bash experiments/campaign/long.sh > /dev/null 2>&1 &
# ARMS (default "transformer diff"), TOKENS (default 251658240) and EXTRA (more train options) serve the
# ablations (experiments/campaign/ablation.sh); THREADS (default 1, one core per arm) gives one arm run alone both
# cores. TEACHER=calib/models/stories260K.gguf trains on fresh teacher stories instead of the cycled corpus
# (experiments/campaign/source.sh; streamed.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/../.."
DQ=${DQ:-.venv/bin/diffquant}
SEED=${SEED:-0}
PRESET=${PRESET:-xs}
LR=${LR:-3e-3}
RUN=${RUN:-experiments/campaign/long/$PRESET-lr$LR-s$SEED}
read -ra extra <<< "${EXTRA:-}"  # more train options (experiments/campaign/ablation.sh)
stop=(); [ -n "${UNTIL:-}" ] && stop=(--stop-at "$UNTIL")
data=$(bash experiments/campaign/source.sh "$RUN")  # --data CORPUS, or TEACHER's stream
read -ra data_args <<< "$data"
mkdir -p "$RUN"
for arch in ${ARMS:-transformer diff}; do
  out=$RUN/$arch
  [ -f "$out/final/config.json" ] && continue
  resume=(); [ -f "$out/state/trainer.json" ] && resume=(--resume)
  nice -n "${NICE:-15}" "$DQ" train --arch "$arch" --preset "$PRESET" "${data_args[@]}" \
    --tokens "${TOKENS:-251658240}" --out "$out" --batch-size 16 --seq-len 512 --recipe stories260k --lr "$LR" \
    --seed "$SEED" --schedule constant --warmup-steps 50 --eval-every 512 --eval-tokens 65536 --track-every 128 \
    --save-every 128 --branch-every 4096 --threads "${THREADS:-1}" "${extra[@]}" "${resume[@]}" "${stop[@]}" \
    >> "$out.log" 2>&1 &
done
wait
