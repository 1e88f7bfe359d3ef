#!/usr/bin/env bash
# Re-run the accuracy checks on the whole zoo on this machine's OpenCL device (PoCL in CI-like
# machines) and record them, with the command and commit, under results/.
#   scripts/record_results.sh [reference] [fp32] [fp16]      (default: all three)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p results
which=("${@:-reference fp32 fp16}")
models=$(ls models/zoo/*.tflite)
for w in ${which[@]}; do
  case $w in
    reference) args=(--device reference) ;;
    fp32) args=(--no-cache) ;;
    fp16) args=(--no-cache --precision fp16) ;;
    *) echo "unknown: $w"; exit 2 ;;
  esac
  out=results/pocl-$w.txt
  {
    echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)"
    echo "# device: $($PY -m litekiln.cli devices | head -1)"
    echo "# command: scripts/check_model.py models/zoo/*.tflite ${args[*]}"
    $PY scripts/check_model.py $models "${args[@]}" 2>&1 | grep -v '^INFO'
  } > "$out"
  tail -1 "$out"
done
