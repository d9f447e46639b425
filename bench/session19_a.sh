#!/usr/bin/env bash
# Session 19, device call A (#23, M=33-64): the sm80 tiles with 64 tokens on the sm90a layout.
# Their correctness cases, a --schedules sweep at M=32/64 (int4 and int8, fp16 and bf16) merged into
# a copy of the shipped profile, and the bench at M=32/64 with it. Logs under $OUT.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
timeout 150 python3 -m pytest -q -m gpu tests/ops/test_sm80_sm90a_layout_gpu.py -k t64x64 -p no:cacheprovider 2>&1 \
  | grep -E "^(FAILED|E  )|passed|failed" | head -12
S=""
for t in w1x1x4 w2x1x2 w2x1x4; do
  b=sm80:t64x64x128_${t}_s4_sm90a; S="$S,$b"; for f in 2 3 4 6 8; do S="$S,${b}_kfused$f"; done; done
S=${S#,}
cp profiles/h100.json "$OUT/h100.json"
for dt in f16 bf16; do for bits in 4 8; do
  ms=64; [ $bits = 4 ] && ms=32,64
  timeout 140 python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --ms $ms --dtype $dt --bits $bits \
    --schedules "$S" --keep-faster --out "$OUT/h100.json" --quiet 2>&1 | tail -1
  cat "$OUT/h100.csv" >> "$OUT/sweeps.csv"
done; done
rm -f "$OUT/h100.csv"; python3 bench/profile_diff.py profiles/h100.json "$OUT/h100.json"
for dt in f16 bf16; do
  MIXED_GEMM_PROFILE=$OUT/h100.json timeout 120 python3 -m mixed_gemm.cli bench --compare --dtype $dt --ms 32,64 \
    --model llama3-8b,llama3-70b --out "$OUT/bench-$dt.md" 2>&1 | tail -4
done
