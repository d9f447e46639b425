#!/usr/bin/env bash
# Session 22: the JIT-off package test (carry .whl and .kpkg).
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
TESTS_TIMEOUT=${TESTS_TIMEOUT:-300} OUT=$OUT bash bench/device_run.sh packaged 2>&1 | grep -E "packaged:|passed|failed" | tail -3
