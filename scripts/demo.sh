#!/usr/bin/env bash
# The main job: set up, fetch a production model (MediaPipe face detection, from the
# mediapipe wheel on PyPI), compile it ahead of time for OpenCL, run it, check it against
# LiteRT, and start it a second time from the cache. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "compiler,test"
PY=.venv/bin/python
MODEL_NAME="${1:-face_detection_short_range}"
$PY scripts/make_zoo.py --only "$MODEL_NAME"
MODEL="$($PY -c "from litekiln.zoo import zoo_path; print(zoo_path('$MODEL_NAME'))")"
CACHE="${LITEKILN_CACHE_DIR:-$PWD/build/demo-cache}"
mkdir -p "$(dirname "$CACHE")"
echo "== inspect: which ops run where"
.venv/bin/litekiln inspect "$MODEL" --cache-dir "$CACHE"
echo "== compile (ahead of time, into $CACHE)"
.venv/bin/litekiln compile "$MODEL" --cache-dir "$CACHE"
echo "== run on OpenCL, compared with LiteRT"
$PY scripts/check_model.py "$MODEL" --cache-dir "$CACHE"
echo "== second start: loads the compiled program from the cache"
.venv/bin/litekiln run "$MODEL" --cache-dir "$CACHE"
