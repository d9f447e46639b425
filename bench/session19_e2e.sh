#!/usr/bin/env bash
# Session 19 (#25): `mixed-gemm e2e --compare --lm-head int4` with the kernel package (JIT off), one
# batch list per device call (E2E_BATCHES), the peer compiled with Dynamo's raised recompile limit.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site:/tmp/kpkg MIXED_GEMM_JIT=0
b=${E2E_BATCHES:-1}
start=$(date +%s)
timeout ${E2E_TIMEOUT:-540} python3 -m mixed_gemm.cli e2e --model llama3-8b --layers 32 --batches $b \
  --reps ${E2E_REPS:-3} --compare --lm-head int4 --out "$OUT/e2e-b${b//,/-}.md" --json "$OUT/e2e-b${b//,/-}.json" 2>&1 \
  | grep -vE "Warning|warn\(|^\s*$" | tail -14
echo "e2e wall: $(( $(date +%s) - start )) s"
