#!/usr/bin/env bash
# Intel's OpenCL CPU runtime from PyPI, beside PoCL: the second real OpenCL vendor the GPU-path
# tests run on (docs/vendors.md, "Intel's OpenCL"). Idempotent and quiet; called by setup.sh
# when the test extra is installed. LITEKILN_INTEL_OPENCL=0 skips it.
#
# * pip installs the runtime into its own prefix, .venv/intel-opencl, never into .venv itself:
#   the wheels also carry a libOpenCL.so and ICD files naming a conda placeholder path. Its
#   libraries find each other (libtbb, libimf, libsvml, libirng, libintlc) through their
#   RUNPATH $ORIGIN, so nothing needs LD_LIBRARY_PATH.
# * Wheels cannot hold symbolic links, so libintelocl.so and libcommon_clang.so come twice,
#   300 MB in all: the copies become links (about 400 MB stay).
# * .venv/etc/OpenCL/vendors gets intel.icd (the absolute path of libintelocl.so) and a copy of
#   every system ICD file (/etc/OpenCL/vendors: PoCL, and a GPU's where there is one), since
#   OCL_ICD_VENDORS names one folder only. tests/conftest.py points OCL_ICD_VENDORS there.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "${LITEKILN_INTEL_OPENCL:-1}" = "0" ] && exit 0
if [ "$(uname -m)" != "x86_64" ]; then
  echo "setup: Intel's OpenCL CPU runtime is x86_64 only; the tests run on PoCL alone here"
  exit 0
fi

# Versions that run litekiln's zoo here (docs/vendors.md); intel-opencl-rt 2026.2.0 asks for
# tbb 2023.* and the compiler runtime's licence package, not for the libraries themselves.
pins=(intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0 tbb==2023.2.0)
prefix=.venv/intel-opencl
vendors=.venv/etc/OpenCL/vendors
stamp="$prefix/.installed-$(echo "${pins[*]}" | sha256sum | cut -c1-12)"

if [ ! -f "$stamp" ]; then
  echo "setup: installing Intel's OpenCL CPU runtime into $prefix (260 MB to download, 410 MB on disk)"
  rm -rf "$prefix"
  mkdir -p build/setup
  log=build/setup/intel-opencl.log
  if ! .venv/bin/python -m pip install -q --prefix "$prefix" --no-warn-script-location \
      --no-compile "${pins[@]}" >"$log" 2>&1; then
    tail -n 40 "$log"; echo "setup: Intel OpenCL install failed (log: $log)"; exit 1
  fi
  # Each versioned name of a library is a full copy: keep the longest name, link the others.
  for f in "$prefix"/lib/lib*.so "$prefix"/lib/lib*.so.*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    for g in "$f".*; do
      if [ -f "$g" ] && [ ! -L "$g" ] && cmp -s "$f" "$g"; then
        ln -sf "$(basename "$g")" "$f"; break
      fi
    done
  done
  # The compiler runtime's LTO linker plugin: the OpenCL runtime never opens it (strace).
  rm -f "$prefix/lib/icx-lto.so"
  touch "$stamp"
fi

lib="$(find "$(pwd)/$prefix" -name libintelocl.so -print -quit)"
[ -n "$lib" ] || { echo "setup: no libintelocl.so under $prefix"; exit 1; }
mkdir -p "$vendors"
want="$(mktemp -d)"
trap 'rm -rf "$want"' EXIT
for icd in /etc/OpenCL/vendors/*.icd; do
  [ -f "$icd" ] && cp "$icd" "$want/"
done
echo "$lib" >"$want/intel.icd"
# Bring the folder to exactly that set, touching nothing that is already right.
for icd in "$vendors"/*.icd; do
  [ -f "$icd" ] && [ ! -f "$want/$(basename "$icd")" ] && rm -f "$icd"
done
for icd in "$want"/*.icd; do
  cmp -s "$icd" "$vendors/$(basename "$icd")" || cp "$icd" "$vendors/"
done
