#!/usr/bin/env bash
# Issue 37's s pair on fresh data: budget.sh (each arm to the branch step UNTIL, default 4,096 = 33.6M tokens, then
# its cooldown to 5/4 of it) with every step's stories drawn fresh from the teacher instead of the cycled corpus,
# otherwise exactly run 3's protocol (long.sh: lr 3e-3, batch 16 × 512, constant after warm-up, branches every
# 4,096 steps). Each block is drawn once into RUN/stream-cache (ignored by git, 2 bytes a token) and read by the
# other arm; arms that reach one together share the drawing (diffquant/stream.py). Resumable like budget.sh.
# Output: experiments/campaign/streamed/PRESET-lrLR-sSEED/ (PRESET default s, SEED 0, LR 3e-3).
#   [ARMS=transformer] [UNTIL=12288] nohup bash experiments/campaign/streamed.sh > /dev/null 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
export TEACHER=${TEACHER:-calib/models/stories260K.gguf} PRESET=${PRESET:-s} SEED=${SEED:-0} LR=${LR:-3e-3}
export RUN=${RUN:-experiments/campaign/streamed/$PRESET-lr$LR-s$SEED} UNTIL=${UNTIL:-4096}
exec bash experiments/campaign/budget.sh
