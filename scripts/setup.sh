#!/usr/bin/env bash
# Idempotent set-up: OpenCL runtime (PoCL) from apt, a virtualenv in .venv with litekiln and
# the extras named in $1 (default: compiler), and with `--zoo NAME...` those models of the zoo
# (scripts/make_zoo.py; `all` for every one). Safe to re-run; does nothing that is already done.
# Quiet: one line per step it takes; the tools' own output goes to a log under build/setup/,
# shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-compiler}"
shift || true
zoo=()
if [ "${1:-}" = "--zoo" ]; then
  shift
  zoo=("$@")
fi
logs=build/setup
mkdir -p "$logs"

# step NAME COMMAND...: run COMMAND with its output in $logs/NAME.log; on failure show the
# log's end and stop.
step() {
  local name="$1"
  shift
  if ! "$@" >"$logs/$name.log" 2>&1; then
    tail -n 40 "$logs/$name.log"
    echo "setup: $name failed (log: $logs/$name.log)"
    exit 1
  fi
}

need_apt=()
dpkg -s pocl-opencl-icd >/dev/null 2>&1 || need_apt+=(pocl-opencl-icd)
dpkg -s ocl-icd-libopencl1 >/dev/null 2>&1 || need_apt+=(ocl-icd-libopencl1)
dpkg -s clinfo >/dev/null 2>&1 || need_apt+=(clinfo)
# The view extra's tests drive a real headless browser (tests/test_view.py).
case ",$extras," in
  *,view,*)
    dpkg -s chromium >/dev/null 2>&1 || need_apt+=(chromium)
    dpkg -s chromium-driver >/dev/null 2>&1 || need_apt+=(chromium-driver)
    ;;
esac
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} (OpenCL on the CPU through PoCL; a browser for the view's tests)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  step apt-update $SUDO apt-get update -qq
  step apt-install $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  step venv "$PY" -m venv .venv
  step pip-upgrade .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=".venv/.litekiln-$extras-$(sha256sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing litekiln[$extras] into .venv (a few minutes the first time)"
  # pip's and setuptools' own notices (deprecation boxes) go to the log.
  step pip-install .venv/bin/python -m pip install -q -e ".[$extras]"
  step import-check .venv/bin/python -c "import litekiln, pyopencl"
  case ",$extras," in  # Keras 2 for the converted test models, on tensorflow-cpu (pyproject.toml)
    *,zoo,*) step tf-keras .venv/bin/python -m pip install -q --no-deps "tf_keras>=2.18,<2.22" ;;
  esac
  touch "$stamp"
fi

# With the test extra: Intel's OpenCL CPU runtime beside PoCL, the GPU-path tests' second
# vendor (scripts/setup_intel_opencl.sh; LITEKILN_INTEL_OPENCL=0 skips it).
case ",$extras," in
  *,test,*) scripts/setup_intel_opencl.sh ;;
esac

if [ ${#zoo[@]} -gt 0 ]; then
  echo "setup: model zoo: ${zoo[*]} (models/zoo; made once, checked after)"
  if [ "${zoo[*]}" = "all" ]; then
    step zoo .venv/bin/python scripts/make_zoo.py
  else
    step zoo .venv/bin/python scripts/make_zoo.py --only "${zoo[@]}"
  fi
fi
