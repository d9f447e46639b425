#!/usr/bin/env bash
# Session 24, after the raw-code change of the lowbit `_ds` gemv kernels (per-pair magics, no fma):
# their GPU tests first; then every lowbit `_ds` candidate timed against each profile entry's shipped
# winner (bench/session23_prof.py) into /tmp/s24_h100.json (a copy of the shipped profile), fp16 M=1
# first; then the bits bench at M 1 and 16 with that profile.
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
timeout 200 python3 -m pytest -q -m gpu tests/ops/test_lowbit_gpu.py -k "${TESTS_K:-_ds}" -p no:cacheprovider \
  > "$OUT/lowbit_ds.log" 2>&1
echo "lowbit ds tests rc $? $((SECONDS - s)) s: $(tail -1 "$OUT/lowbit_ds.log")"
grep -E "^(FAILED|ERROR)" "$OUT/lowbit_ds.log" | head -5
[ -f /tmp/s24_h100.json ] || cp profiles/h100.json /tmp/s24_h100.json
cases=${CASES:-"f16:2:64:1:_ds f16:3:64:1:_ds f16:2:64:2,4,8:_ds f16:3:64:2,4,8:_ds bf16:2:64:1,2,4,8:_ds bf16:3:64:1,2,4,8:_ds"}
BUDGET_S=${PROF_BUDGET:-240} timeout $(( ${PROF_BUDGET:-240} + 60 )) python3 bench/session23_prof.py /tmp/s24_h100.json $cases \
  > "$OUT/prof.log" 2>&1
echo "profile rc $? $((SECONDS - s)) s"; grep -c "was" "$OUT/prof.log"
cp /tmp/s24_h100.json "$OUT/h100.json"
export MIXED_GEMM_PROFILE=/tmp/s24_h100.json
BENCH_BITS=${BENCH_BITS:-2 3} LIMIT=$(( ${LIMIT:-570} - (SECONDS - s) )) bash bench/bits_bench.sh
grep -v "^$" "$OUT/prof.log" | tail -60
