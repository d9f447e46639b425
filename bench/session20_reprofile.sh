#!/usr/bin/env bash
# Session 20: re-profile moe_gemv at Mixtral's 1-2 tokens on the gate|up stacks (their strips are
# read in the interleaved order now), merged into the device copy of profiles/h100.json, then the
# 1-token layer A/B against the previous tree (.ab_old/) with that profile.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
[ -d /tmp/site/cutlass_library ] || bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
xz -dc .ab_old/moe_old.txz | tar xf - -C $MIXED_GEMM_CACHE_DIR
PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m mixed_gemm.cli profile-moe --model mixtral-8x7b --tokens 1,2 \
  --out profiles/h100.json > "$OUT/profile.log" 2>&1; tail -6 "$OUT/profile.log"
cp profiles/h100.json "$OUT/h100.json"
OUT=$OUT PRESETS=mixtral-8x7b TOKENS=1,2 bash bench/ab_moe_epilogue.sh 2>&1 | tail -16
