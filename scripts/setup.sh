#!/usr/bin/env bash
# Idempotent set-up: OpenCL runtime (PoCL) from apt, a virtualenv in .venv with litekiln and
# the extras named in $1 (default: compiler). Safe to re-run; does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-compiler}"

need_apt=()
dpkg -s pocl-opencl-icd >/dev/null 2>&1 || need_apt+=(pocl-opencl-icd)
dpkg -s ocl-icd-libopencl1 >/dev/null 2>&1 || need_apt+=(ocl-icd-libopencl1)
dpkg -s clinfo >/dev/null 2>&1 || need_apt+=(clinfo)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} (OpenCL on the CPU through PoCL)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=".venv/.litekiln-$extras-$(sha256sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing litekiln[$extras] into .venv"
  # pip's and setuptools' own notices go to a log, shown only when the install fails.
  if ! .venv/bin/python -m pip install -q -e ".[$extras]" >.venv/pip-install.log 2>&1; then
    tail -n 40 .venv/pip-install.log; echo "setup: install failed (log: .venv/pip-install.log)"; exit 1
  fi
  .venv/bin/python -c "import litekiln, pyopencl" || { echo "setup: install failed"; exit 1; }
  touch "$stamp"
fi
