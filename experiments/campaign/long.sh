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
# (experiments/campaign/settings.sh; streamed.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/../.."
source experiments/campaign/settings.sh
stop=(); [ -n "${UNTIL:-}" ] && stop=(--stop-at "$UNTIL")
mkdir -p "$RUN"
for arch in ${ARMS:-transformer diff}; do
  out=$RUN/$arch
  [ -f "$out/final/config.json" ] && continue
  resume=(); [ -f "$out/state/trainer.json" ] && resume=(--resume)
  nice -n "${NICE:-15}" "$DQ" train --arch "$arch" --preset "$PRESET" "${data[@]}" \
    --tokens "${TOKENS:-251658240}" --out "$out" --schedule constant --branch-every 4096 "${protocol[@]}" \
    "${resume[@]}" "${stop[@]}" >> "$out.log" 2>&1 &
done
wait
