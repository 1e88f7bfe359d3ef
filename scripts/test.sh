#!/usr/bin/env bash
# The test suite: set up (PoCL, .venv with the compiler and test extras), materialise the small
# models the tests use, run pytest. Extra arguments go to pytest. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "compiler,test"
.venv/bin/python scripts/make_zoo.py --only mediapipe
exec .venv/bin/python -m pytest "$@"
