#!/usr/bin/env bash
# One budget of a long pair (long.sh; PRESET, SEED, LR, ARMS, EXTRA as there): each arm trains to the branch step
# UNTIL and goes straight on to that branch's cooldown (cooldown.sh) without waiting for the other arm, so the core
# of the faster arm does not idle. Resumable, like both scripts.
#   PRESET=s UNTIL=12288 nohup bash experiments/campaign/budget.sh > /dev/null 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${UNTIL:-}" ] || { echo "budget.sh: set UNTIL to the branch step to reach and cool (e.g. 12288)" >&2; exit 2; }
pids=()
for arch in ${ARMS:-transformer diff}; do
  (ARMS=$arch bash experiments/campaign/long.sh && ARMS=$arch BRANCHES=$UNTIL bash experiments/campaign/cooldown.sh) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed arm fails the script (rerun resumes it)
