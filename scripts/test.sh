#!/usr/bin/env bash
# The test suite: set up (PoCL, a headless browser, .venv with the compiler, test, zoo, lint,
# view and torch-peer extras: torch's CPU build for the torch peer's tests), materialise the
# model zoo (MediaPipe models from PyPI, example models generated with TensorFlow), run pytest.
# Extra arguments go to pytest. Safe to re-run; set-up prints one line per step it takes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "compiler,test,zoo,lint,view,torch-peer" --zoo all
exec .venv/bin/python -m pytest "$@"
