# What long.sh and cooldown.sh share, sourced by both from the repository root: the run's settings (PRESET, SEED,
# LR, RUN, EXTRA, THREADS, TEACHER, CORPUS, DQ), its training data and the options every arm keeps, so that a cooldown
# continues exactly the protocol of the stable run it branches from.
# The data: the cycled teacher corpus (--data; its shards are parked in main's history, experiments/corpus/README.md,
# and are brought back here once), or with TEACHER set, that teacher's fresh stories drawn for every step
# (--teacher; diffquant/stream.py), whose blocks RUN/stream-cache keeps so that a pair's second arm reads what the
# first drew.
DQ=${DQ:-.venv/bin/diffquant}
SEED=${SEED:-0}
PRESET=${PRESET:-xs}
LR=${LR:-3e-3}
RUN=${RUN:-experiments/campaign/long/$PRESET-lr$LR-s$SEED}
if [ -n "${TEACHER:-}" ]; then
  data=(--teacher "$TEACHER" --stream-cache "$RUN/stream-cache")
else
  CORPUS=${CORPUS:-experiments/corpus/stories260k-s0}  # tests name one of their own
  if [ "$CORPUS" = experiments/corpus/stories260k-s0 ] && [ ! -f "$CORPUS/shard_00002.bin" ]; then
    bash experiments/campaign/restore_states.sh "$CORPUS" >&2
  fi
  data=(--data "$CORPUS")
fi
read -ra extra <<< "${EXTRA:-}"  # more train options (experiments/campaign/ablation.sh)
protocol=(--batch-size 16 --seq-len 512 --recipe stories260k --lr "$LR" --seed "$SEED" --warmup-steps 50
  --eval-every 512 --eval-tokens 65536 --track-every 128 --save-every 128 --threads "${THREADS:-1}" "${extra[@]}")
