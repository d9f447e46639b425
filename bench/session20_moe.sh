#!/usr/bin/env bash
# Session 20 (issue #24): SiLU·mul in the gate|up GEMMs' epilogues. The MoE GPU tests, then the
# MoE bench (same presets and tokens as session 14's table).
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -m gpu tests/ops/test_moe_sm90a_gpu.py tests/ops/test_moe_sm80_gpu.py \
  tests/ops/test_moe_gemv_gpu.py tests/ops/test_experts.py tests/ops/test_gated_gpu.py tests/nn/test_moe.py \
  -p no:cacheprovider 2>&1 | tee "$OUT/moe_tests.log" | grep -vE "^[.sxFE]+ *\[" | tail -12
grep -E "^(FAILED|ERROR)" "$OUT/moe_tests.log" | head -20
[ "${BENCH:-1}" = 1 ] && timeout ${BENCH_TIMEOUT:-200} python3 -m mixed_gemm.cli bench --moe ${PRESETS:-mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite} \
  --tokens ${TOKENS:-1,4,16,64,256,4096} --out "$OUT/bench_moe.md" > "$OUT/bench_moe.log" 2>&1
tail -25 "$OUT/bench_moe.md" 2>/dev/null
[ "${BENCH80:-1}" = 1 ] && timeout ${BENCH80_TIMEOUT:-120} python3 bench/bench_moe80.py --models mixtral-8x7b,qwen3-30b-a3b \
  --tokens 256,1024 > "$OUT/bench_moe80.md" 2>&1
cat "$OUT/bench_moe80.md" 2>/dev/null | tail -6
