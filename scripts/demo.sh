#!/usr/bin/env bash
# The main job: set up, fetch a production model (MediaPipe face detection, from the
# mediapipe wheel on PyPI) and take it through litekiln, printing one table of what was
# measured in this run (scripts/demo.py): what runs where (with the ops folded at load), the
# cold start (compile and device build, empty cache), accuracy against LiteRT, the warm start
# (from the cache) and steady latency against LiteRT. Its cache is build/demo-cache, emptied
# each time. One to two minutes on two cores once set up; safe to re-run.
# Usage: scripts/demo.sh [ZOO_MODEL_NAME]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_NAME="${1:-face_detection_short_range}"
scripts/setup.sh "compiler,test" --zoo "$MODEL_NAME"
PY=.venv/bin/python
MODEL="$($PY -c "from litekiln.zoo import zoo_path; print(zoo_path('$MODEL_NAME'))")"
exec "$PY" scripts/demo.py "$MODEL" --cache-dir build/demo-cache
