#!/usr/bin/env bash
# The test suite: set up (PoCL, a headless browser, .venv with the compiler, test, zoo, lint,
# view and torch-peer extras: torch's CPU build for the torch peer's tests), materialise the
# model zoo (MediaPipe models from PyPI, example models generated with TensorFlow), run pytest.
# Extra arguments go to pytest. Safe to re-run; set-up prints one line per step it takes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "compiler,test,zoo,lint,view,torch-peer" --zoo all
# The test files are spread over the cores (pytest-xdist; a file's tests stay in one worker, so
# that its module fixtures and models are made once): at most 4 workers, each holding TVM and
# the models of its files. LITEKILN_TEST_JOBS=0 runs them all in this process.
cores=$(nproc 2>/dev/null || echo 1)
jobs=${LITEKILN_TEST_JOBS:-$(( cores < 4 ? cores : 4 ))}
if [ "$jobs" -le 1 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$jobs" --dist loadfile "$@"
