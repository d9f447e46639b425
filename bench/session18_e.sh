#!/usr/bin/env bash
# Session 18, device call E: the hand-over change under Inductor and CUDA-graph trees (GPU tests),
# then the residual A/B's eager step with it.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
timeout 200 python3 -m pytest -q -m gpu tests/integrations/test_compiled_generation_gpu.py tests/ops/test_residual_gpu.py \
  tests/ops/test_gated_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | grep -E "^(FAILED|E  )|passed|failed" | head -12
timeout 170 python3 bench/bench_residual.py --layers 32 --batches 1,16 --reps 3 --out "$OUT/residual.md" 2>&1 \
  | grep -vE "Warning|warn\(" | tail -8
