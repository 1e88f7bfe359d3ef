#!/usr/bin/env bash
# A/B of two compiler trees on one GPU machine, in one device call: run.sh's torchpeer step
# (litekiln against the PyTorch twins, LiteRT's GPU path left out) on tree A, the repo root
# with its .devcache, and on tree B, .devkitB/ (a copy of the other tree's litekiln/, scripts/
# and pyproject.toml with its own .devcache; its run.sh must know NO_LITERT_GPU), in the order
# of ROUNDS, each tree's kit kept unpacked between its rounds (KEEP_KIT). Timings between
# device calls differ by 5-10% (machines, tuning picks); within one call, alternating rounds
# compare the trees.
#
# Build machine, for tree B (a worktree of the other commit, models/ linked to this one's):
#   (cd B && PYTHONPATH=$PWD PY=/path/to/.venv/bin/python REFILL=1 FP16_MODELS= \
#      bash scripts/remote_gpu/prepare.sh MODELS...)
#   mkdir .devkitB && (cd B && git archive HEAD litekiln scripts pyproject.toml | tar -x -C ../A/.devkitB \
#      && cp -r .devcache ../A/.devkitB/)
# then prepare.sh for the same models here (tree A). Device (carry .whl .gl .devcache .devkitB):
#   AB_MODELS="m1 m2" ROUNDS="A1 B1 A2 B2" bash scripts/remote_gpu/ab.sh
# Near the carry limit (64 MiB with .whl): pack B as one file in a folder .git/info/exclude
# ignores, `tar -cJf .abpack/devkitB.tar.xz -C .devkitB .` less its .devcache/wheels (A's
# serve), carry .abpack instead of .devkitB, and start the device command with
#   mkdir -p .devkitB && tar -xJf .abpack/devkitB.tar.xz -C .devkitB \
#     && cp -r .devcache/wheels .devkitB/.devcache/ && ...
# STEPS=latency (default torchpeer) times the rounds with `litekiln bench` instead (LiteRT CPU
# the peer; AB_GREP, an extended regex, adds the log lines to print, e.g. "^(gemma|g_|smoke)").
# Each round prints its rows and leaves $OUT/<round>.tgz (run.sh's outputs: one file a round,
# the device tool returns few files).
set -u
ROOT=$PWD
export RUNS=${RUNS:-200} STEPS=${STEPS:-torchpeer} TORCH_MODES=${TORCH_MODES:-eager,cuda_graph} NO_LITERT_GPU=1
for round in $ROUNDS; do
  t=$(date +%s)
  case $round in
    A*) (cd "$ROOT" && KEEP_KIT=1 MODELS="$AB_MODELS" OUT=$OUT/$round \
           bash scripts/remote_gpu/run.sh > /dev/null 2>&1) ;;
    B*) (cd "$ROOT/.devkitB" && ln -sfn ../.whl .whl && ln -sfn ../.gl .gl \
           && KEEP_KIT=1 MODELS="$AB_MODELS" RUN_KIT=/tmp/litekiln-gpukit-b OUT=$OUT/$round \
           bash scripts/remote_gpu/run.sh > /dev/null 2>&1) ;;
    *) echo "ab.sh: a round is A<n> or B<n>, not $round"; exit 2 ;;
  esac
  echo "== $round $(( $(date +%s) - t )) s"
  grep -h -E "^(timm|tv|keras|mp)_|eager \+ CUDA graph|kit .*(match|other)${AB_GREP:+|$AB_GREP}" "$OUT/$round/log.txt"
  tar czf "$OUT/$round.tgz" -C "$OUT" "$round" && rm -rf "${OUT:?}/$round"
done
