#!/usr/bin/env bash
# First start on PoCL after a plain `litekiln compile`, this tree against an earlier commit, on
# the same machine in the same run (issue 16: "that build takes half of today's time").
#
#   scripts/pocl_first_start_vs.sh f80634a models/zoo/hand_landmark_lite.tflite 3
#
# For each tree (the earlier commit in a temporary git worktree, then this one): a plain
# `litekiln compile MODEL` into a fresh cache (the schedules this machine's default device
# gets). Then REPEAT times, the two trees alternated: a copy of that cache, PoCL's kernel
# cache off and empty, `litekiln run MODEL` in a fresh process with the first start waiting
# for the device build (LITEKILN_CPU_FIRST=off: the build itself is what is timed, not the
# CPU's first outputs). Prints each run's "loaded in" (cache read and the device program)
# and "inference" (PoCL compiles each kernel at its first launch), as `litekiln run` reports
# them, and their sum: the time to the device's first outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: $0 BASE_COMMIT MODEL [REPEAT]}
MODEL=${2:?usage: $0 BASE_COMMIT MODEL [REPEAT]}
REPEAT=${3:-3}
HERE=$PWD
WORK=$(mktemp -d)
trap 'git -C "$HERE" worktree remove --force "$WORK/base" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
ln -s "$HERE/.venv" "$WORK/base/.venv"
MODEL_ABS=$(realpath "$MODEL")

compile() {  # tree cache
  (cd "$1" && PYTHONPATH="$1" "$HERE/.venv/bin/python" -m litekiln.cli compile "$MODEL_ABS" \
    --cache-dir "$2" >/dev/null)
}
first_start() {  # tree cache
  rm -rf "$WORK/run" && cp -r "$2" "$WORK/run"
  local pocl
  pocl=$(mktemp -d)
  (cd "$1" && POCL_KERNEL_CACHE=0 POCL_CACHE_DIR="$pocl" LITEKILN_CPU_FIRST=off \
    PYTHONPATH="$1" "$HERE/.venv/bin/python" -m litekiln.cli run "$MODEL_ABS" \
    --cache-dir "$WORK/run" 2>&1) |
    sed -n 's/.*loaded in \([0-9.]*\) ms.*inference \([0-9.]*\) ms.*/\1 \2/p' | head -1
  rm -rf "$pocl"
}

echo "$MODEL on $(uname -n), $(nproc) cores; base $(git rev-parse --short "$BASE"), this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)')"
compile "$WORK/base" "$WORK/cache-base"
compile "$HERE" "$WORK/cache-this"
for i in $(seq "$REPEAT"); do
  for which in base this; do
    tree=$HERE && [ "$which" = base ] && tree=$WORK/base
    read -r load infer <<<"$(first_start "$tree" "$WORK/cache-$which")"
    printf '%-5s start %d: loaded %8.0f ms + first inference %8.0f ms = %6.1f s\n' \
      "$which" "$i" "$load" "$infer" "$(echo "($load + $infer) / 1000" | bc -l)"
  done
done
