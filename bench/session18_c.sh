#!/usr/bin/env bash
# Session 18, device call C: the JIT-off package test and the bench with the package (fp16, bf16).
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
OUT=$OUT bash bench/device_run.sh packaged 2>&1 | grep -E "packaged:|passed|failed" | tail -3
for dt in f16 bf16; do
  PYTHONPATH=$PYTHONPATH:/tmp/kpkg MIXED_GEMM_JIT=0 timeout 200 python3 -m mixed_gemm.cli bench --compare \
    --model llama3-8b,llama3-70b --ms 1,2,4,8,16,32,64,256,4096 --dtype $dt --out "$OUT/bench-$dt.md" \
    --json "$OUT/bench-$dt.json" --plot "$OUT/bench-$dt.png" 2>&1 | grep -E "^\| (1|16|32|64|256|4096) \|" | head -6
done
