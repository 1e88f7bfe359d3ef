#!/usr/bin/env bash
# GPU-machine side of the remote-GPU kit: runtime only (no TVM, no package index). Installs the
# carried wheels, points OpenCL at NVIDIA's driver and LiteRT's WebGPU at Vulkan, blocks TVM,
# then over the models that scripts/remote_gpu/prepare.sh compiled into .devcache/:
#   1. accuracy   litekiln vs LiteRT CPU, max|ours - ref| / max(1, max|ref|) within the
#                 per-model tolerance (1e-4 unless litekiln/check.py says otherwise)
#   2. start-up   litekiln bench --startup --warm-only (see docs/benchmarks.md for what cold,
#                 shipped and warm mean here, and how the cold figure is assembled)
#   3. latency    litekiln bench: litekiln vs LiteRT CPU (XNNPACK, all cores) and LiteRT GPU
#                 (WebGPU over Vulkan), with per-kernel profile and launch overhead
#   (graphtrace, on request: STEPS=graphtrace) each kernel's device time and gaps in the graph
#                 (scripts/remote_gpu/graph_trace.py, torch.profiler's CUPTI trace)
#   (floorprobe, on request) a tiny model's floor: bare CUDA graphs' round trips, the same
#                 network as a torch CUDA graph, litekiln, LiteRT CPU (floor_probe.py)
#   (torchpeer, on request: STEPS=torchpeer) litekiln bench --peer torch: the PyTorch twins of
#                 the kit's corpus models (prepare.sh) in eager mode, with a CUDA graph and
#                 through torch.compile, on the machine's own torch (docs/remote-gpu.md)
# and writes to $OUT: log.txt env.txt accuracy.json startup.json latency.json build.json.
#
# On the device (repo root; carry .whl .gl .devcache):   bash scripts/remote_gpu/run.sh
# (.devcache/kit.tar.xz holds the models and the cache compiled by prepare.sh)
# Rehearsal here on PoCL with the project venv:          LOCAL=1 scripts/remote_gpu/run.sh
# Knobs: MODELS="a b" (names from .devcache/models.txt), RUNS, REPEAT, COLD_REPEAT (startup: first
#        and shipped starts; default REPEAT), STEPS="accuracy startup latency",
#        KEEP_KIT=1 (keep the kit a previous call on this warm machine unpacked, tuned binaries included),
#        RUN_KIT=DIR (where to unpack it; default /tmp/litekiln-gpukit),
#        T_ACCURACY/T_STARTUP/T_LATENCY/T_TORCH (seconds per step; the device tool allows 600 in
#        all), TORCH_MODES (torchpeer: e.g. eager,cuda_graph; default all three),
#        NO_LITERT_GPU=1 (torchpeer: LiteRT's GPU path left out, for A/B runs that fit one call).
# Too slow for one call? Split it: STEPS="accuracy startup" in one call, STEPS=latency in the
# next (each call repeats the ~20 s set-up; $OUT is emptied between calls).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-/tmp/litekiln-gpukit-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-accuracy startup latency accuracy16 latency16}

if [ -n "${LOCAL:-}" ]; then
  PY=${PY:-$REPO/.venv/bin/python}
  SITE=""
  RUNS=${RUNS:-5}; REPEAT=${REPEAT:-1}
  T_ACCURACY=${T_ACCURACY:-1800}; T_STARTUP=${T_STARTUP:-3600}; T_LATENCY=${T_LATENCY:-3600}
  T_TORCH=${T_TORCH:-3600}
else
  PY=${PY:-python3}
  SITE=/tmp/site
  RUNS=${RUNS:-200}; REPEAT=${REPEAT:-3}
  # Sum + set-up (~20 s) stays under the device tool's 600 s per command; a step that runs out
  # of time keeps what it wrote so far (the bench writes --out after each model).
  T_ACCURACY=${T_ACCURACY:-200}; T_STARTUP=${T_STARTUP:-270}; T_LATENCY=${T_LATENCY:-170}
  T_TORCH=${T_TORCH:-480}  # torch.compile takes tens of seconds a model: run it on its own
  # Vulkan loader for LiteRT's GPU path (WebGPU over Vulkan).
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl $(ls .devcache/wheels/*.whl 2>/dev/null) \
    || { echo "run.sh: wheel install failed"; exit 1; }
  # Bytecode, as `pip install` (without --no-compile) leaves it for an app: imports are part of
  # every start-up measured here, and the carried sources would otherwise be compiled again by
  # each fresh process (or on every start, where the image sets PYTHONDONTWRITEBYTECODE).
  "$PY" -m compileall -q -j 0 "$SITE" "$REPO/litekiln" "$REPO/scripts" > /dev/null 2>&1 || true
  # NVIDIA's OpenCL library is present but no ICD file names it: make a vendors folder.
  lib=$(ls /usr/lib/libnvidia-opencl.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 \
        /usr/local/nvidia/lib64/libnvidia-opencl.so.1 2>/dev/null | head -1)
  mkdir -p /tmp/icd && echo "${lib:-/usr/lib/libnvidia-opencl.so.1}" > /tmp/icd/nvidia.icd
  export OCL_ICD_VENDORS=/tmp/icd
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
  export LITEKILN_DEVICE=${LITEKILN_DEVICE:-gpu}
fi

# Runtime only: TVM must never be imported (a sitecustomize on PYTHONPATH reaches every child).
mkdir -p /tmp/notvm
printf 'import sys\nsys.modules["tvm"] = None  # runtime-only run: importing TVM fails\n' \
  > /tmp/notvm/sitecustomize.py
export PYTHONPATH=/tmp/notvm${SITE:+:$SITE}:$REPO
unset LITEKILN_NO_CACHE LITEKILN_PRECISION LITEKILN_CACHE_DIR LITEKILN_OP_TABLE

# Unpack the kit (models + compiled cache) into a private, writable folder: the cache store
# refuses folders that others could write to.
KIT=${RUN_KIT:-/tmp/litekiln-gpukit}  # where the kit is unpacked
TARBALL=.devcache/kit.tar.xz
if [ ! -f "$TARBALL" ]; then  # a kit carried in parts (prepare.sh SPLIT_MB)
  TARBALL=/tmp/litekiln-kit.tar.xz
  id=$(cat .devcache/kit.id 2>/dev/null)
  parts=$(ls .devkit[0-9]*/kit-"$id".part-* 2>/dev/null | sort -t. -k3)
  [ -n "$id" ] && [ -n "$parts" ] && cat $parts > "$TARBALL" \
    || { echo "run.sh: no .devcache/kit.tar.xz and no .devkit*/kit-ID.part-* (run prepare.sh)"; exit 1; }
  echo "kit $id joined from $(echo $parts | wc -w) parts"
fi
# KEEP_KIT=1 on a warm machine: the same kit unpacked by an earlier call stays, with what its
# first loads stored there (this device's program binaries and tuning choices), so a later
# call measures warm loads only.
kit_id=$(sha256sum "$TARBALL" | cut -c1-16)
if [ -n "${KEEP_KIT:-}" ] && [ "$(cat "$KIT/.kit-id" 2>/dev/null)" = "$kit_id" ]; then
  echo "kit $kit_id already unpacked in $KIT (KEEP_KIT): kept, with its device binaries"
else
  rm -rf "$KIT" && mkdir -p "$KIT" && chmod 700 "$KIT"
  "$PY" -c 'import sys, tarfile as t; t.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
    "$TARBALL" "$KIT" || { echo "run.sh: cannot unpack the kit $TARBALL (run prepare.sh)"; exit 1; }
  # Refilled models (prepare.sh REFILL=1) travel stripped: make their weights again.
  for r in "$KIT"/models/*.tflite.refill.json; do
    [ -f "$r" ] || continue
    m=${r%.refill.json}
    "$PY" scripts/remote_gpu/refill.py fill "$m.stripped" "$r" "$m" && rm "$m.stripped" \
      || { echo "run.sh: cannot refill $m"; exit 1; }
  done
  chmod -R go-rwx "$KIT"
  echo "$kit_id" > "$KIT/.kit-id"
fi
CACHE=$KIT/cache
cp .devcache/build.json "$OUT/build.json" 2>/dev/null
# The cache key holds a hash of the compiler/ops/model sources: a kit made from other sources
# would miss everywhere and, with TVM blocked, fail model by model. Stop at once instead.
"$PY" - .devcache/build.json <<'EOF' || exit 1
import json, sys
from litekiln.artifact.versions import compiler_hash
want, have = json.load(open(sys.argv[1])).get("compiler_hash", ""), compiler_hash()
if want != have:
    sys.exit(f"run.sh: the kit was compiled from other litekiln sources (kit {want[:12]}, "
             f"tree {have[:12]}): run scripts/remote_gpu/prepare.sh on this tree, then call again")
print(f"kit matches this tree's compiler sources ({have[:12]})")
EOF
# The kit's models were compiled with this op table (prepare.sh OP_TABLE): open them with it.
export LITEKILN_OP_TABLE=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("op_table", "documented"))' .devcache/build.json)
echo "op table: $LITEKILN_OP_TABLE"
read -r -a NAMES <<< "${MODELS:-$(tr '\n' ' ' < .devcache/models.txt)}"
PATHS=()
for n in "${NAMES[@]}"; do PATHS+=("$KIT/models/$n.tflite"); done

{
  echo "date: $(date -u +%FT%TZ)"; uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
  "$PY" - <<'EOF'
import importlib, sys
import importlib.metadata as md
for dist in ("torch", "torchvision", "timm"):  # the torch peer's (torchpeer step), not imported
    try:
        print(f"{dist}: {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
for m in ("pyopencl", "ai_edge_litert", "ml_dtypes", "diskcache", "farmhash", "tflite"):
    try:
        mod = importlib.import_module(m)
        print(f"{m}: ok {getattr(mod, '__version__', '')}")
    except Exception as e:  # noqa: BLE001
        print(f"{m}: MISSING ({e})")
try:
    import tvm  # noqa: F401
    print("tvm: IMPORTABLE (should be blocked)")
except ImportError:
    print("tvm: blocked (runtime only)")
EOF
  "$PY" -m litekiln.cli devices
  echo "models: ${NAMES[*]}"; echo "runs=$RUNS repeat=$REPEAT"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

status=0
step() {  # step NAME FUNCTION: run it if NAME is in $STEPS, report its exit status and time
  case " $STEPS " in *" $1 "*) ;; *) return 0 ;; esac
  echo "== $1"
  local t0=$SECONDS
  "$2"
  local rc=$?
  echo "== $1: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
}

accuracy() { _accuracy fp32 accuracy.json; }
accuracy16() { _accuracy fp16 accuracy_fp16.json; }
_accuracy() {
  timeout "$T_ACCURACY" "$PY" scripts/check_model.py "${PATHS[@]}" --cache-dir "$CACHE" --json \
    --precision "$1" > "$OUT/$2"
  local rc=$?
  "$PY" - "$OUT/$2" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    verdict = "ok  " if r["ok"] else "FAIL"
    print(f"  {r['model']:32s} {verdict} rel_err={r['rel_err']:.2e} (tol {r['tolerance']:.0e}) {r['error']}")
EOF
  return $rc
}

startup() {
  timeout "$T_STARTUP" "$PY" -m litekiln.cli bench --startup --warm-only --litert-gpu --cache-dir "$CACHE" \
    --repeat "$REPEAT" ${COLD_REPEAT:+--cold-repeat "$COLD_REPEAT"} --out "$OUT/startup.json" "${PATHS[@]}"
}

latency() {
  timeout "$T_LATENCY" "$PY" -m litekiln.cli bench --cache-dir "$CACHE" --runs "$RUNS" --profile \
    --out "$OUT/latency.json" "${PATHS[@]}"
}

halflog() {  # why the device's OpenCL compiler rejects TVM's half kernels: the build log
  PYOPENCL_COMPILER_OUTPUT=1 "$PY" scripts/remote_gpu/halflog.py "$CACHE" "${PATHS[@]}" \
    > "$OUT/halflog.txt" 2>&1
  head -c 2000 "$OUT/halflog.txt"
}

profilewarm() {  # cProfile of one warm start per model (after the steps above warmed the cache)
  for p in "${PATHS[@]}"; do
    "$PY" scripts/remote_gpu/profile_warm.py "$p" --cache-dir "$CACHE" --top 25 2>/dev/null
  done > "$OUT/profile_warm.txt"
  grep "^== " "$OUT/profile_warm.txt"
}

breakdown() {  # where a warm start's time goes, per model, each in a fresh process
  for p in "${PATHS[@]}"; do
    "$PY" scripts/remote_gpu/breakdown.py "$p" --cache-dir "$CACHE" 2>/dev/null | tail -1
  done > "$OUT/breakdown.jsonl"
  cat "$OUT/breakdown.jsonl"
}

latencypy() {  # pyopencl's enqueue loop (LITEKILN_FAST_LAUNCH=off) against the default ctypes one
  LITEKILN_FAST_LAUNCH=off timeout "$T_LATENCY" "$PY" -m litekiln.cli bench --cache-dir "$CACHE" \
    --runs "$RUNS" --out "$OUT/latency_pyopencl.json" "${PATHS[@]}"
}

graphprobe() {  # which launch path each partition takes (CUDA graph or OpenCL) and why; PTX of each
  local rc=0 p
  : > "$OUT/graph_probe.jsonl"
  for p in "${PATHS[@]}"; do  # one process per model: a hang costs one model's limit only
    timeout "${T_PROBE:-90}" "$PY" scripts/remote_gpu/graph_probe.py "$p" --cache-dir "$CACHE" \
      --ptx-out /tmp/ptx >> "$OUT/graph_probe.jsonl" || { rc=1; echo "{\"model\": \"$p\", \"exit\": $?}" >> "$OUT/graph_probe.jsonl"; }
  done
  cat "$OUT/graph_probe.jsonl"
  (cd /tmp && tar czf "$OUT/ptx.tar.gz" ptx 2>/dev/null)
  return $rc
}

probeinit() {  # the device opening's parts on NVIDIA (OpenCL, CUDA, both), fresh processes
  "$PY" scripts/remote_gpu/probe_init.py > "$OUT/probe_init.jsonl"
  cat "$OUT/probe_init.jsonl"
}

latencycl() {  # the OpenCL launch loop (LITEKILN_CUDA_GRAPH=off), for comparison with the graphs
  LITEKILN_CUDA_GRAPH=off timeout "$T_LATENCY" "$PY" -m litekiln.cli bench --cache-dir "$CACHE" \
    --runs "$RUNS" --out "$OUT/latency_opencl.json" "${PATHS[@]}"
}

latency16() {
  timeout "$T_LATENCY" "$PY" -m litekiln.cli bench --cache-dir "$CACHE" --runs "$RUNS" --profile \
    --precision fp16 --out "$OUT/latency_fp16.json" "${PATHS[@]}"
}

zerocopy() {  # host time per inference: numpy I/O against torch CUDA tensors bound via DLPack
  timeout "$T_LATENCY" "$PY" scripts/remote_gpu/zero_copy.py --cache-dir "$CACHE" --runs "$RUNS" \
    --out "$OUT/zero_copy.json" "${PATHS[@]}"
}

ptxbisect() {  # kernels of the shipped PTX that compute otherwise than OpenCL's own PTX
  timeout "$T_LATENCY" "$PY" scripts/remote_gpu/ptx_bisect.py --cache-dir "$CACHE" \
    --out "$OUT/ptx_bisect.json" ${PTX_ALT:+--alt "$PTX_ALT"} "${PATHS[@]}"
}

graphtrace() {  # each kernel's own device time and the gaps between them, inside the CUDA graph
  timeout "$T_LATENCY" "$PY" scripts/remote_gpu/graph_trace.py "${PATHS[@]}" --cache-dir "$CACHE" \
    --runs "${TRACE_RUNS:-30}" --out "$OUT/graph_trace.json" | cut -c1-400
}

floorprobe() {  # a tiny model's floor: bare CUDA graphs, torch's graph, litekiln, LiteRT CPU
  timeout "$T_LATENCY" "$PY" scripts/remote_gpu/floor_probe.py "${PATHS[@]}" --cache-dir "$CACHE" \
    --runs "${FLOOR_RUNS:-2000}" --out "$OUT/floor_probe.json"
}

torchpeer() {  # litekiln against each model's PyTorch twin (eager, CUDA graph, torch.compile)
  timeout "$T_TORCH" "$PY" -m litekiln.cli bench --cache-dir "$CACHE" --runs "$RUNS" --peer torch \
    ${NO_LITERT_GPU:+--skip-litert-gpu} ${TORCH_MODES:+--torch-modes "$TORCH_MODES"} ${PROFILE:+--profile} --out "$OUT/torch_peer.json" "${PATHS[@]}"
}

statecarry() {  # a basic LSTM cell stepped over time: state carried on the device vs the host loop
  timeout "$T_LATENCY" "$PY" scripts/remote_gpu/state_carry.py --cache-dir "$CACHE" \
    --steps "${CARRY_STEPS:-500}" --out "$OUT/state_carry.json" "${PATHS[@]}"
}

step graphprobe graphprobe
step accuracy accuracy
step startup startup
step latency latency
step accuracy16 accuracy16
step latency16 latency16
step halflog halflog
step breakdown breakdown
step profilewarm profilewarm
step latencypy latencypy
step latencycl latencycl
step probeinit probeinit
step zerocopy zerocopy
step statecarry statecarry
step ptxbisect ptxbisect
step torchpeer torchpeer
step graphtrace graphtrace
step floorprobe floorprobe
echo "== results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $status
