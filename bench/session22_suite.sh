#!/usr/bin/env bash
# Session 22, the closing GPU run: the whole suite but the packaged test (carry .whl and the kcache
# parts made by bench/pack_kcache.sh; the package test runs in the next call, bench/session22_pkg.sh).
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
SUITE_TIMEOUT=${SUITE_TIMEOUT:-470} OUT=$OUT bash bench/device_run.sh suite-rest 2>&1 | tail -4
grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
