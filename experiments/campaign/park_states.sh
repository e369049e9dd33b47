#!/usr/bin/env bash
# Park a run's resumable states, branches and snapshots (its state/, branches/ and snapshots/ folders, which git
# ignores) in main's history without keeping them in main's tree: one commit adds them (or, where main's tree still
# tracks them unchanged, HEAD already holds them), the next removes them again and records the first in
# experiments/campaign/states.json, from where restore_states.sh brings them back into any clone. A run may have
# several parked parts (one per commit); parking a path again replaces its older part. The files on disk are left
# as they are. Park only what a later session must resume: every newly added byte counts twice against a
# submission's diff budget (added, then removed).
#   bash experiments/campaign/park_states.sh RUN [PATH ...]   RUN: a run folder, e.g. experiments/campaign/long/xs-lr3e-3-s0;
#                                                             PATHs inside it (e.g. diff/state, or files such as a
#                                                             corpus's shards, which .gitignore must then name): park only those
#   NOTE="step 1,881 of 4,096: ..." sets the note restore_states.sh --list shows (how to continue the run)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
STATES=${STATES:-experiments/campaign/states.json}
die() { echo "park_states.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: park_states.sh RUN [PATH ...]"
run=${1%/}; shift
[ -d "$run" ] || die "$run is not a folder"
[ -f "$STATES" ] || die "no $STATES"
git diff --cached --quiet || die "the index holds staged changes: commit or unstage them first"
if [ $# -gt 0 ]; then
  rel=("${@%/}"); for p in "${rel[@]}"; do [ -e "$run/$p" ] || die "$run/$p does not exist"; done
else
  mapfile -t rel < <(cd "$run" && find . -type d \( -name state -o -name branches -o -name snapshots \) -prune -print \
                     | sed 's|^\./||' | sort)
fi
[ ${#rel[@]} -gt 0 ] || die "$run has no state/, branches/ or snapshots/ to park"
full=(); for p in "${rel[@]}"; do full+=("$run/$p"); done
git add -f -- "${full[@]}"
if ! git diff --cached --quiet; then
  git commit -q -m "park: $run's ${rel[*]} (bash experiments/campaign/restore_states.sh $run brings them back)"
fi
commit=$(git rev-parse HEAD)  # holds every path: just committed, or tracked unchanged in main's tree
git rm -r -q --cached -- "${full[@]}"
python3 - "$STATES" "$run" "$commit" "${rel[@]}" <<'PY'
import json, os, sys
path, run, commit, *paths = sys.argv[1:]
with open(path) as fh:
    states = json.load(fh)
parts = [dict(p, paths=[q for q in p["paths"] if q not in paths]) for p in states["runs"].get(run, [])]
parts = [p for p in parts if p["paths"]]  # a path parked again leaves its older part
states["runs"][run] = parts + [{"commit": commit, "paths": paths, "note": os.environ.get("NOTE", "parked by park_states.sh")}]
states["runs"] = dict(sorted(states["runs"].items()))
tmp = f"{path}.tmp"
with open(tmp, "w") as fh:
    json.dump(states, fh, indent=2, ensure_ascii=False)
    fh.write("\n")
os.replace(tmp, path)
PY
git add "$STATES"
git commit -q -m "park: $run's states leave the tree again ($STATES names ${commit:0:9})"
echo "parked ${full[*]} at ${commit:0:9}"
