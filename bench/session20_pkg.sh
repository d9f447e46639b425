#!/usr/bin/env bash
# Session 20: the JIT-off package test, then the MoE bench from the package (carry .whl and .kpkg).
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
TESTS_TIMEOUT=${TESTS_TIMEOUT:-200} OUT=$OUT bash bench/device_run.sh packaged 2>&1 | grep -E "packaged:|passed|failed" | tail -3
PYTHONPATH=$PYTHONPATH:/tmp/kpkg MIXED_GEMM_JIT=0 timeout ${BENCH_TIMEOUT:-220} python3 -m mixed_gemm.cli bench \
  --moe mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,4,16,64,256,4096 --out "$OUT/bench_moe.md" > "$OUT/bench_moe.log" 2>&1
tail -22 "$OUT/bench_moe.md"
