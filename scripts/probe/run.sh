#!/usr/bin/env bash
# The probe: models nobody here designed, outside the corpus (scripts/probe/models.jsonl),
# converted from PyTorch with litert-torch (Keras ones with the TFLite converter, quantized
# variants among them: scripts/probe/convert_keras.py) and checked against LiteRT on this machine's
# OpenCL (PoCL: `scripts/check_model.py --device opencl --warm`, a fresh cache per model, each
# model checked at its first start and again at a warm start from that cache), then
# summarised (scripts/probe/summary.py). Needs the corpus virtualenv (build/corpus-venv,
# scripts/corpus.py's) and the project's (.venv).
#
#   bash scripts/probe/run.sh OUT_DIR [NAME ...]     # NAME: a model's "out"; default all
#
# OUT_DIR gets NAME.tflite, conv.log (one OK/FAIL line a model), check_NAME.log, summary.md.
# Re-running skips the models already converted and checked.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT_DIR [NAME ...]}; shift
mkdir -p "$OUT"
TORCH_PY=${TORCH_PY:-build/corpus-venv/bin/python}
PY=${PY:-.venv/bin/python}
want() { [ $# -eq 0 ] || printf '%s\n' "$@" | grep -qx "$NAME_"; }
while read -r line; do
  NAME_=$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["out"])' "$line")
  want "$@" || continue
  if [ ! -f "$OUT/$NAME_.tflite" ] && ! grep -q " $NAME_ " "$OUT/conv.log" 2>/dev/null; then
    case $line in  # Keras through the TFLite converter (tensorflow-cpu), the rest litert-torch
      *'"lib":"keras'*) CONV=("$PY" scripts/probe/convert_keras.py) ;;
      *'"lib":"wheel'*) CONV=("$PY" scripts/probe/from_wheel.py) ;;  # a model a wheel ships
      *'"lib":"generative'*) CONV=("$TORCH_PY" scripts/probe/generative.py) ;;  # litert-torch LLMs
      *) CONV=("$TORCH_PY" scripts/probe/convert.py) ;;
    esac
    timeout 900 "${CONV[@]}" "$OUT" "$line" 2>/dev/null \
      | grep -E "^(OK|FAIL)" >> "$OUT/conv.log" || echo "FAIL $NAME_ timeout or crash" >> "$OUT/conv.log"
  fi
  if [ -f "$OUT/$NAME_.tflite" ] && ! grep -qE "^$NAME_ +[0-9.]+ s$" "$OUT/check_$NAME_.log" 2>/dev/null; then
    rm -rf "$OUT/cache_$NAME_"
    /usr/bin/time -f "$NAME_ %e s" timeout 1500 "$PY" scripts/check_model.py "$OUT/$NAME_.tflite" \
      --device opencl --cache-dir "$OUT/cache_$NAME_" --warm > "$OUT/check_$NAME_.log" 2>&1
    rm -rf "$OUT/cache_$NAME_"
  fi
done < scripts/probe/models.jsonl
"$PY" scripts/probe/summary.py "$OUT" > "$OUT/summary.md" && cat "$OUT/summary.md"
