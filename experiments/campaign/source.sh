#!/usr/bin/env bash
# The training data options of a campaign run (long.sh, cooldown.sh), printed on one line for run folder $1: the
# cycled teacher corpus (--data; its shards are parked in main's history, experiments/corpus/README.md, and are
# brought back here once), or with TEACHER set, that teacher's fresh stories drawn for every step (--teacher;
# diffquant/stream.py), whose blocks $1/stream-cache keeps so that a pair's second arm reads what the first drew.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${TEACHER:-}" ]; then
  echo "--teacher $TEACHER --stream-cache ${1:?source.sh RUN}/stream-cache"
else
  [ -f experiments/corpus/stories260k-s0/shard_00002.bin ] ||
    bash experiments/campaign/restore_states.sh experiments/corpus/stories260k-s0 >&2
  echo "--data experiments/corpus/stories260k-s0"
fi
