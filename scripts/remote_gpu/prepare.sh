#!/usr/bin/env bash
# Build machine side of the remote-GPU kit: compile the chosen models ahead of time (fp32, default
# options but the op table, the same ones run.sh uses), so that the GPU machine, which has no
# TVM, only loads them. OP_TABLE (default extended: the ops LiteRT's GPU delegate, the peer
# of the benchmark, runs too, such as HARD_SWISH and MediaPipe's transposed conv) is recorded
# in build.json and run.sh opens the models with it.
#
#   scripts/remote_gpu/prepare.sh                # the default MediaPipe models
#   scripts/remote_gpu/prepare.sh face_landmark /path/to/model.tflite ...
#   REFILL=1 scripts/remote_gpu/prepare.sh models/corpus/*.tflite   # weights refilled
#   REFILL=1 KEEP_WEIGHTS="pose_landmark_full ..." prepare.sh ...   # but these keep theirs
#     (scripts/remote_gpu/refill.py: random weights made again on the GPU machine, exactly,
#     so the kit carries the graphs only; for models whose weights are random anyway)
#   FP16_MODELS= scripts/remote_gpu/prepare.sh tv_squeezenet1_1 timm_lcnet_050 ...
#     PyTorch twins for run.sh's torchpeer step (`litekiln bench --peer torch`): a corpus
#     model converted from PyTorch (models/corpus/) brings its manifest entry (recipe,
#     state-dict digest) into the kit as models/corpus.json, and a timm model the timm wheel
#     its record names (.devcache/wheels/). Without REFILL the model travels as it is, so
#     torch's outputs compare with litekiln's; refilled, only the timings compare (the bench
#     says so). See docs/remote-gpu.md, "PyTorch twins", for what fits one call.
#
# Work folder build/gpu-kit/ (git-ignored; KIT=DIR for another): models/NAME.tflite and cache/
# (the litekiln cache: compiled models only; this machine's device binaries are dropped, being
# useless there).
# What travels, .devcache/ (git-ignored, carried by the device call):
#   kit.tar.xz     build/gpu-kit's models/ and cache/ (xz: the fp32 constants halve; the
#                  carried tree must stay under 64 MiB with the wheels)
#   build.json     where and how long each compile took (the cold estimate's compile part)
#   models.txt     the model names run.sh reads
#   wheels/        the timm wheel, where the kit holds timm models' PyTorch twins
# Needs the project's venv with the compiler (scripts/setup.sh "compiler,test").
# Run it LAST, on the tree that travels: the cache key holds a hash of litekiln's compiler, ops
# and model sources, so any edit there after this makes every entry a miss (run.sh checks).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DEFAULT_MODELS=(face_detection_short_range face_detection_full_range_sparse face_landmark hand_landmark_lite
                selfie_segmentation palm_detection_lite pose_landmark_full)
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=("${DEFAULT_MODELS[@]}")

resolve() {  # NAME or path -> a .tflite path
  local m=$1
  if [ -f "$m" ]; then echo "$m"; return; fi
  for c in "models/zoo/$m.tflite" "models/corpus/$m.tflite" /tmp/mp/mediapipe/modules/*/"$m.tflite"; do
    if [ -f "$c" ]; then echo "$c"; return; fi
  done
  echo "prepare: no model '$m' (not a file, not in models/zoo/, models/corpus/ nor /tmp/mp/mediapipe/modules/);" \
       "make it with scripts/make_zoo.py --only $m" >&2
  return 1
}

KIT=${KIT:-build/gpu-kit}
rm -rf .devcache "$KIT"
mkdir -p .devcache "$KIT/models"
chmod 700 .devcache "$KIT"
: > .devcache/models.txt
: > .devcache/sources.tsv
for m in "${MODELS[@]}"; do
  src=$(resolve "$m")
  name=$(basename "$src" .tflite)
  printf '%s\t%s\n' "$name" "$src" >> .devcache/sources.tsv
  if [ -n "${REFILL:-}" ] && [[ " ${KEEP_WEIGHTS:-} " != *" $name "* ]]; then
    # weights made again there (refill.py): the corpus' 550 MB; KEEP_WEIGHTS names the
    # models that travel with their own (small production models: trained weights keep
    # their accuracy checks well conditioned, random refills amplify rounding)
    "$PY" scripts/remote_gpu/refill.py make "$src" "$KIT/models/$name.tflite" >&2
  else
    cp "$src" "$KIT/models/$name.tflite"
  fi
  echo "$name" >> .devcache/models.txt
done

# PyTorch twins: the manifest entries of the corpus models converted from PyTorch (the bench's
# torch peer finds corpus.json beside the model), and the timm wheel their records name.
timm=$("$PY" - "$KIT/models" <<'EOF'
import json, sys
from pathlib import Path

entries = {}
for line in Path(".devcache/sources.tsv").read_text().splitlines():
    name, src = line.split("\t", 1)
    manifest = Path(src).parent / "corpus.json"
    entry = json.loads(manifest.read_text())["models"].get(name) if manifest.is_file() else None
    if entry and (entry.get("spec") or {}).get("library") in ("torchvision", "timm"):
        entries[name] = entry
if entries:
    Path(sys.argv[1], "corpus.json").write_text(json.dumps({"schema": 1, "models": entries}))
    print(f"prepare: PyTorch twins: {' '.join(entries)}", file=sys.stderr)
versions = {(e.get("provenance") or {}).get("versions", {}).get("timm") for e in entries.values()
            if e["spec"]["library"] == "timm"}
print(" ".join(sorted(v for v in versions if v)))
EOF
)
rm .devcache/sources.tsv
for v in $timm; do  # (pure Python: any platform's wheel does; run.sh installs it there)
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d .devcache/wheels "timm==$v"
done

# Compile each model in its own fresh process with an empty cache, so the recorded compile
# time is a cold one; the driver's kernel cache is off for the same reason.
export CUDA_CACHE_DISABLE=1 POCL_KERNEL_CACHE=0
unset LITEKILN_NO_CACHE LITEKILN_PRECISION
export LITEKILN_OP_TABLE=${OP_TABLE:-extended}
: > .devcache/compile.jsonl
while read -r name; do
  echo "prepare: compiling $name" >&2
  "$PY" -m litekiln.cli compile "$KIT/models/$name.tflite" --cache-dir "$KIT/cache" --schedules fast --json \
    | "$PY" -c 'import json,sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]' \
    >> .devcache/compile.jsonl
done < .devcache/models.txt
# fp16 too, for run.sh's fp16 steps; not part of the cold timing. FP16_MODELS (default: all)
# and FP16_HALF (default: "native emulated") keep the kit under the carry limit.
FP16_MODELS=${FP16_MODELS-$(tr '\n' ' ' < .devcache/models.txt)}
for name in $FP16_MODELS; do
  for half in ${FP16_HALF:-native emulated}; do
    echo "prepare: compiling $name (fp16, $half)" >&2
    "$PY" -m litekiln.cli compile "$KIT/models/$name.tflite" --cache-dir "$KIT/cache" \
      --precision fp16 --half "$half" --schedules fast > /dev/null
  done
done

KIT=$KIT "$PY" - <<'EOF'
import json, os, platform, subprocess, sys, time
from pathlib import Path

from litekiln.bench import _strip_binaries
from litekiln.artifact.versions import compiler_hash

dropped = _strip_binaries(os.path.join(os.environ["KIT"], "cache"))
t = time.perf_counter()
import tvm  # noqa: E402  (timed: part of a real cold start, not of compile_s)
tvm_import_s = time.perf_counter() - t
rows = [json.loads(l) for l in Path(".devcache/compile.jsonl").read_text().splitlines() if l.strip()]
os.remove(".devcache/compile.jsonl")
try:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    rev = ""
build = {
    "what": "ahead-of-time compile of the remote-GPU kit's models (scripts/remote_gpu/prepare.sh)",
    "host": platform.node(),
    "cpu": platform.processor() or platform.machine(),
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "tvm_version": tvm.__version__,
    "tvm_import_s": round(tvm_import_s, 3),
    "git_rev": rev,
    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    "binaries_dropped": dropped,
    # Part of every compiled-model cache key: run.sh refuses a kit made from other sources.
    "compiler_hash": compiler_hash(),
    # Part of the key too: run.sh opens the models with this table.
    "op_table": os.environ["LITEKILN_OP_TABLE"],
    "note": "compile_s: the compiler's own timing (partition, lower, codegen), TVM import "
            "excluded (tvm_import_s); compile_process_s: the whole `litekiln compile` process "
            "here: Python start, TVM import, compile, and the program build on this machine's "
            "OpenCL device (PoCL, with its kernel cache off: slow)",
    "models": [
        {"model": Path(r["model"]).stem, "token": r["token"], "kernels": r["kernels"],
         "partitions": r["partitions"], "gpu_ops": r["gpu_ops"], "cpu_ops": r["cpu_ops"],
         "compile_s": r["compile_seconds"], "compile_process_s": r["seconds"]}
        for r in rows
    ],
}
Path(".devcache/build.json").write_text(json.dumps(build, indent=2) + "\n")
for m in build["models"]:
    print(f"  {m['model']:32s} {m['kernels']:4d} kernels  compile {m['compile_s']:.1f} s", file=sys.stderr)
EOF
if [ -n "${REFILL:-}" ]; then  # carry the refilled models stripped of their weights
  for r in "$KIT"/models/*.tflite.refill.json; do
    m=${r%.refill.json}
    "$PY" scripts/remote_gpu/refill.py strip "$m" "$m.stripped" && rm "$m"
  done
fi
echo "prepare: packing .devcache/kit.tar.xz" >&2
tar cJf .devcache/kit.tar.xz -C "$KIT" models cache
du -sh "$KIT/models" "$KIT/cache" .devcache/kit.tar.xz
# A kit larger than one call may carry (64 MiB with the wheels) travels in parts: SPLIT_MB=N
# cuts it into N-MiB pieces, one per folder .devkit1, .devkit2, ... (git-ignored). Carry
# .whl/.gl/.devkit1 in a first call, each further .devkitK in the next calls while the machine
# is still warm (ignored folders a call does not name stay on it), and .devcache with the last
# one; run.sh joins the parts.
rm -rf .devkit[0-9]*
if [ -n "${SPLIT_MB:-}" ]; then
  # The parts carry the kit's id, so that parts of an earlier kit still on the warm machine
  # are never joined in.
  id=$(sha256sum .devcache/kit.tar.xz | cut -c1-12)
  echo "$id" > .devcache/kit.id
  split -b "${SPLIT_MB}M" -d -a 2 .devcache/kit.tar.xz ".devcache/kit-$id.part-"
  rm .devcache/kit.tar.xz
  k=0
  for part in .devcache/kit-"$id".part-*; do
    k=$((k + 1)); mkdir -p ".devkit$k"; mv "$part" ".devkit$k/"
  done
  du -sh .devkit[0-9]*
fi
