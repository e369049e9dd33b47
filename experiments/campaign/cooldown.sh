#!/usr/bin/env bash
# Cooldown branches of a long pair (experiments/campaign/long.sh; PRESET, SEED, LR, ARMS, EXTRA, THREADS, TEACHER
# as there): from each state both arms kept at step N (RUN/ARCH/branches/stepN), the same run continues N/4 more
# steps with the learning rate decaying linearly to 10% (wsd, decay from step N), so the decayed part is the last
# 20% as in part 1's sweep.
# Output: RUN/cooldown/ARCH-stepN (final/ and train_log.json; the resumable state is dropped once finished).
# Resumable and idempotent: finished cooldowns are skipped. The two arms of a branch run concurrently.
# BRANCHES="24576" cools only those branch steps (default: every branch kept), e.g. to reach a run's end budget
# (the 24,576 branch cooled to 30,720 steps = 251.7M tokens) without the branches between.
set -euo pipefail
cd "$(dirname "$0")/../.."
source experiments/campaign/settings.sh
cool() {  # one arm's cooldown from branch $2 (step $3)
  local arch=$1 name=$2 step=$3
  local src=$RUN/$arch/branches/$name out=$RUN/cooldown/$arch-$name
  [ -d "$src" ] && [ ! -f "$out/final/config.json" ] || return 0
  local resume=(--branch-from "$src"); [ -f "$out/state/trainer.json" ] && resume=(--resume)
  mkdir -p "$RUN/cooldown"
  nice -n "${NICE:-5}" "$DQ" train --arch "$arch" --preset "$PRESET" "${data[@]}" \
    --tokens $(( (step + step / 4) * 16 * 512 )) --out "$out" --schedule wsd --decay-start "$step" "${protocol[@]}" \
    "${resume[@]}" >> "$out.log" 2>&1
  rm -rf "$out/state"
}
arms=(${ARMS:-transformer diff})
for branch in "$RUN/${arms[0]}"/branches/step*; do
  [ -d "$branch" ] || continue
  name=$(basename "$branch"); step=$((10#${name#step}))
  [ -z "${BRANCHES:-}" ] || [[ " $BRANCHES " == *" $step "* ]] || continue
  pids=()
  for arch in "${arms[@]}"; do
    cool "$arch" "$name" "$step" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # a failed arm fails the script (rerun resumes it)
done
