#!/usr/bin/env bash
# Session 18, device call A: the residual epilogue's tests and end-to-end A/B, the bf16 int8 M=64
# sweep, and where a small sm90a GEMM's time goes (ncu). Logs under $OUT.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
timeout 200 python3 -m pytest -q -m gpu tests/ops/test_residual_gpu.py -p no:cacheprovider 2>&1 | tail -3
timeout 200 python3 -m pytest -q -m gpu tests/integrations/test_compiled_generation_gpu.py -k residual -p no:cacheprovider 2>&1 | tail -3
cp profiles/h100.json "$OUT/h100.json"
timeout 120 python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --ms 64 --dtype bf16 --bits 8 --out "$OUT/h100.json" --quiet 2>&1 | tail -1
cp "$OUT/h100.csv" "$OUT/bf16-u8-m64.csv"
python3 bench/profile_diff.py profiles/h100.json "$OUT/h100.json" | grep "u8" | grep "M=64"
timeout ${RES_TIMEOUT:-300} python3 bench/bench_residual.py --layers 32 --batches 1,16 --compiled-batches 1 --reps 3 \
  --out "$OUT/residual.md" 2>&1 | grep -vE "Warning|warn\(" | tail -12
while read -r line; do
  [ -z "$line" ] || [ "${line#\#}" != "$line" ] && continue
  echo "== $line"
  timeout 90 ncu --clock-control none --kernel-name regex:"mg_|device_kernel" --launch-skip 3 --launch-count 1 \
    --metrics gpu__time_duration.sum,launch__grid_size,sm__cycles_active.avg,dram__bytes_read.sum \
    python3 bench/ncu_case.py $line 2>&1 | grep -E "median|gpu__time|grid_size|cycles_active|dram__bytes" | head -6
done < bench/ncu_sm90a.txt
