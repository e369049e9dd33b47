#!/usr/bin/env bash
# Write a run's parked states, branches and snapshots (experiments/campaign/states.json) back into this clone, so
# the run resumes (long.sh, cooldown.sh, ablation.sh) as if they had never left the tree. Works in a
# `git clone --depth 1` of main: the one commit that holds them is fetched alone from origin (depth 1) when it is
# not already here. The paths stay ignored by git; nothing that exists is overwritten.
#   bash experiments/campaign/restore_states.sh RUN [RUN ...]     RUN: a run folder as named in states.json
#   bash experiments/campaign/restore_states.sh --finals   every parked final's weights that are not here (what
#                                                          recomputing the verdicts from scratch needs)
#   bash experiments/campaign/restore_states.sh --list
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
STATES=${STATES:-experiments/campaign/states.json}
die() { echo "restore_states.sh: $*" >&2; exit 2; }
[ -f "$STATES" ] || die "no $STATES"
runs_json() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["runs"]))' "$STATES"; }
if [ "${1:-}" = "--list" ]; then
  runs_json | python3 -c 'import json,sys
for run, parts in json.load(sys.stdin).items():
    for p in parts: print(run, p["commit"][:9], " ".join(p["paths"]), "--", p.get("note", ""))'
  exit 0
fi
if [ "${1:-}" = "--finals" ]; then
  mapfile -t finals < <(runs_json | python3 -c 'import json, os, sys
for run, parts in json.load(sys.stdin).items():
    if run.endswith("/final") and not all(os.path.exists(f"{run}/{p}") for part in parts for p in part["paths"]):
        print(run)')
  [ ${#finals[@]} -gt 0 ] || { echo "every parked final is here"; exit 0; }
  set -- "${finals[@]}"
fi
[ $# -gt 0 ] || die "name a run (--list shows them)"
for run in "$@"; do
  run=${run%/}
  # one line per parked part: "COMMIT PATH ..."
  parts=$(runs_json | python3 -c 'import json,sys
for p in json.load(sys.stdin).get(sys.argv[1], []): print(p["commit"], *p["paths"])' "$run")
  [ -n "$parts" ] || die "$run is not in $STATES (--list shows the parked runs)"
  while read -r commit paths; do  # refuse before writing anything
    for p in $paths; do [ ! -e "$run/$p" ] || die "$run/$p exists: move it away first"; done
  done <<< "$parts"
  while read -r commit paths; do
    read -ra rel <<< "$paths"
    full=(); for p in "${rel[@]}"; do full+=("$run/$p"); done
    if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
      echo "fetching ${commit:0:9} (depth 1) ..." >&2
      git fetch -q --depth 1 "${REMOTE:-origin}" "$commit" < /dev/null || die "cannot fetch $commit from ${REMOTE:-origin}"
    fi
    git archive "$commit" -- "${full[@]}" | tar -x
    echo "restored ${full[*]} from ${commit:0:9}"
  done <<< "$parts"
done
