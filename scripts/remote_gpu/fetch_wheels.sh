#!/usr/bin/env bash
# Fetch what the GPU machine lacks (no package index there), into git-ignored folders:
#   .whl/  cp312 manylinux wheels: the litekiln runtime's dependencies and LiteRT (the peer)
#   .gl/   the Vulkan loader (and GL/EGL loaders) as Debian packages, for LiteRT's GPU path
#          (WebGPU over Vulkan); run.sh unpacks them into / on the device.
# Versions are pinned to the ones the project's venv is tested with; one version of each
# (two versions of one package stop the whole `pip install --no-index` on the device).
# Left out on purpose, because the device image already has them (PyTorch/JAX image):
# numpy, tqdm, protobuf, ml_dtypes. run.sh checks that they import.
#
#   scripts/remote_gpu/fetch_wheels.sh      # idempotent: skips what is already there
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(
  pyopencl==2026.1.4
  pytools==2026.1.1
  platformdirs==4.14.7
  siphash24==1.9
  typing_extensions==4.16.0
  diskcache==5.6.3
  pyfarmhash==0.5.1
  tflite==2.18.0
  flatbuffers==25.12.19
  ai-edge-litert==2.3.0
  backports.strenum==1.2.8
)
PY=${PYTHON:-python3}
mkdir -p .whl
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}
  # Wheel file names normalise '-' and '.' to '_' (PEP 427).
  norm=$(echo "$name" | tr '.-' '__')
  if ls .whl/ 2>/dev/null | grep -qi "^${norm}-"; then
    continue
  fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_35_x86_64 -d .whl "$spec"
done
# Exactly one wheel per package, or the device install fails.
dups=$(ls .whl/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z' 'a-z' | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "more than one wheel of: $dups; delete the extra ones in .whl/" >&2
  exit 1
fi

# Vulkan/GL loaders (amd64 packages whatever this machine's architecture is), as the device
# README says; unpacked on the device with dpkg -x into / .
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  # shellcheck disable=SC2086
  apt-get $o update -qq
  # shellcheck disable=SC2086
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .whl .gl
ls .whl .gl
