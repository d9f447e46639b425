#!/usr/bin/env bash
# Session 23, the closing GPU run: the whole suite but the packaged test, after the last kernel
# change. Carry kcache/ archives over one or more calls (bench/s23_env.sh unpacks each once).
set -uo pipefail
source bench/s23_env.sh
timeout ${SUITE_TIMEOUT:-540} python3 -m pytest -q -m gpu tests -p no:cacheprovider \
  --ignore=tests/ops/test_packaged_gpu.py 2>&1 | tee "$OUT/suite.log" | grep -vE "^[.sxFE]+ *\[" | tail -8
grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
