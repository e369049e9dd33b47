#!/usr/bin/env bash
# Issue 13's ablations (run 5), one seed (SEED, default 0), trained exactly like the long pair
# (experiments/campaign/long.sh, the same full-length schedule) to its first branch (UNTIL, default 4,096 steps =
# 33.6M tokens) and cooled to 41.9M (cooldown.sh); UNTIL=8192 continues it to the next branch and cools that.
# ABLATION picks one:
#   lambda0.8     Diff with a constant λ_init = 0.8 in every layer (the paper's schedule is 0.8 - 0.6·e^(-0.3·l));
#                 only the Diff arm: verdicts.py pairs it with the long run's Transformer of the same seed and branch
#   init-default  both arms with PyTorch's default Linear initialisation (the official Diff code's) instead of
#                 N(0, 0.02)
# Output: experiments/campaign/ablation/xs-lr3e-3-sSEED-ABLATION/. Resumable: rerun to continue.
#   ABLATION=lambda0.8 nohup bash experiments/campaign/ablation.sh > /dev/null 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=${SEED:-0}
case "${ABLATION:-}" in
  lambda0.8) export ARMS=diff EXTRA="--lambda-init 0.8" ;;
  init-default) export ARMS="${ARMS:-transformer diff}" EXTRA="--init default" ;;  # ARMS=transformer: one arm at a time
  *) echo "ablation.sh: set ABLATION to lambda0.8 or init-default" >&2; exit 2 ;;
esac
export SEED RUN=${RUN:-experiments/campaign/ablation/xs-lr3e-3-s$SEED-$ABLATION} UNTIL=${UNTIL:-4096}
bash experiments/campaign/long.sh
bash experiments/campaign/cooldown.sh
