#!/usr/bin/env bash
# One command: make the project's virtual environment, install diffquant into it, run the main job.
#   bash setup.sh            install, then run `diffquant demo` on the shipped models
#   bash setup.sh --no-demo  install only (what CI does before the tests)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${DIFFQUANT_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first and pinned: the CPU build lies on disk; an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q torch==2.13.0
# every extra the README uses: lmeval (lm-evaluation-harness, for the adapter and its tests; adds datasets,
# pandas, ...; torch is untouched), export (compressed-tensors, which transformers needs to load our exports)
"$VENV/bin/python" -m pip install -q -e '.[dev,bnb,big,lmeval,export]'
if [ "${1:-}" != "--no-demo" ]; then
    "$VENV/bin/diffquant" demo
fi
