#!/usr/bin/env bash
# Session 23: the JIT-off package test (carry .kpkg; the wheels from an earlier call on this machine).
set -uo pipefail
source bench/s23_env.sh
MIXED_GEMM_KERNEL_WHEEL=$(ls $PWD/.kpkg/*.whl) timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -s -m gpu \
  tests/ops/test_packaged_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/packaged.log" | grep -E "packaged:|passed|failed" | tail -3
