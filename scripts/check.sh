#!/usr/bin/env bash
# The project's own checks, all of which CI requires clean: the import layers (lint-imports,
# contracts in pyproject.toml), ruff's lint and format, mypy, dead code (vulture at 80%),
# the repository's own links (every relative link in a Markdown file resolves) and the
# generated schema tables (litekiln/model/schema_tables.py, from the installed tflite package).
# Needs the `lint` and `test` extras in .venv (scripts/test.sh installs them). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
run() {
  echo "check: $*"
  "$@" || status=1
}
run .venv/bin/lint-imports --no-cache
run .venv/bin/ruff check litekiln tests scripts
run .venv/bin/ruff format --check litekiln tests scripts
run .venv/bin/mypy litekiln
run .venv/bin/vulture litekiln --min-confidence 80
run .venv/bin/python scripts/check_links.py
run .venv/bin/python scripts/gen_schema_tables.py --check
exit $status
