#!/usr/bin/env bash
# Session 18, device call B: after the last kernel change, the new residual tests, the whole GPU
# suite but the packaged test, then the residual A/B with the eager step. Logs under $OUT.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
timeout 120 python3 -m pytest -q -m gpu tests/ops/test_residual_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/residual-tests.log" \
  | grep -E "^(FAILED|E  )|passed|failed" | head -20
SUITE_TIMEOUT=${SUITE_TIMEOUT:-420} OUT=$OUT bash bench/device_run.sh suite-rest 2>&1 | tail -8
grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
timeout ${RES_TIMEOUT:-150} python3 bench/bench_residual.py --layers 32 --batches 1,16 --reps 3 \
  --out "$OUT/residual.md" 2>&1 | grep -vE "Warning|warn\(" | tail -9
