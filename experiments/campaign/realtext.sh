#!/usr/bin/env bash
# The real-text control of the outlier-regime campaign (issue 13, run 4): part 1's short protocol (xs, lr 1e-2,
# 6.03M tokens, wsd with the last 20% decayed, seed 0) with the teacher corpus replaced by the real calib train
# text (lowercased TinyStories and books, 13.5M tokens in stories260K's vocabulary: 0.45 epochs). Both arms at
# once, identical data order. Resumable: rerun to continue.
#   nohup bash experiments/campaign/realtext.sh > /dev/null 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DQ=${DQ:-.venv/bin/diffquant}
CORPUS=experiments/corpus/realtext-512
RUNS=experiments/campaign/realtext
# the manifest is committed, the shards are not: a clone redraws them (the same bytes; training checks their sha256)
[ -f "$CORPUS/shard_00000.bin" ] || "$PY" experiments/campaign/realtext_corpus.py --out "$CORPUS"
mkdir -p "$RUNS"
for arch in transformer diff; do
  out=$RUNS/$arch-lr1e-2-s0
  [ -f "$out/final/config.json" ] && continue
  resume=(); [ -f "$out/state/trainer.json" ] && resume=(--resume)
  nice -n "${NICE:-10}" "$DQ" train --arch "$arch" --preset xs --data "$CORPUS" --tokens 6029312 --out "$out" \
    --batch-size 16 --seq-len 512 --recipe stories260k --lr 1e-2 --seed 0 --schedule wsd --cooldown-frac 0.2 \
    --warmup-steps 50 --eval-every 92 --eval-tokens 65536 --track-every 46 --save-every 46 --threads 1 \
    "${resume[@]}" >> "$out.log" 2>&1 &
done
wait
