#!/usr/bin/env bash
# Compile time of this tree against an earlier commit, on the same machine in the same run.
#
#   scripts/compile_time_vs.sh BASE "MODEL..." [REPEAT] [JOBS...]
#   scripts/compile_time_vs.sh c778500 "models/zoo/mobilenet_v1.tflite" 2 1 2
#
# Per model and repeat, alternated: the earlier commit (a temporary git worktree), then this
# tree once per JOBS value (LITEKILN_COMPILE_JOBS; the earlier tree ignores it), each a plain
# `litekiln compile MODEL --schedules fast` (the GPU schedules with their tuning variants;
# SCHEDULES=fast-cpu: the schedules of a plain compile on a machine without a GPU) into a fresh
# cache, LITEKILN_PTX=off (no nvcc step), in a fresh process. Prints the
# compile's own time ("compiled in", after the imports) and the process's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: $0 BASE_COMMIT "MODEL..." [REPEAT] [JOBS...]}
MODELS=${2:?usage: $0 BASE_COMMIT "MODEL..." [REPEAT] [JOBS...]}
REPEAT=${3:-2}
shift 3 || shift $#
JOBS=("${@:-0}")
HERE=$PWD
WORK=$(mktemp -d)
trap 'git -C "$HERE" worktree remove --force "$WORK/base" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
ln -s "$HERE/.venv" "$WORK/base/.venv"

one() {  # label tree jobs model
  rm -rf "$WORK/cache"
  local start end line
  start=$(date +%s.%N)
  line=$(cd "$2" && LITEKILN_PTX=off LITEKILN_COMPILE_JOBS="$3" PYTHONPATH="$2" \
    "$HERE/.venv/bin/python" -m litekiln.cli compile "$4" --cache-dir "$WORK/cache" \
    --schedules "${SCHEDULES:-fast}" 2>/dev/null | sed -n 's/.*compiled in \([0-9.]*\) s.*/\1/p')
  end=$(date +%s.%N)
  printf '%-28s %-22s compile %6s s, process %6.1f s\n' "$(basename "$4")" "$1" "$line" \
    "$(echo "$end - $start" | bc -l)"
}

echo "$(uname -n), $(nproc) cores; base $(git rev-parse --short "$BASE"), this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)')"
for model in $MODELS; do
  model=$(realpath "$model")
  for i in $(seq "$REPEAT"); do
    one "base" "$WORK/base" 1 "$model"
    for j in "${JOBS[@]}"; do
      one "this, jobs $j" "$HERE" "$j" "$model"
    done
  done
done
