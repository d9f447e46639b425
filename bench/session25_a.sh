#!/usr/bin/env bash
# Session 25, after 1:2-sparse moved to mma.sp (a new sparse layout, gemv only): the lowbit GPU tests
# of 7 bits first; then every gemv candidate of 1:2-sparse profiled at M 1-32, fp16 and bf16
# (bench/session23_prof.py, an empty substring: all of them), into /tmp/s25_h100.json, a copy of
# the shipped profile (whose 7-bit entries below 256 tokens were dropped).
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
timeout 240 python3 -m pytest -q -m gpu tests/ops/test_lowbit_gpu.py -k "${TESTS_K:-u7 or 7]}" -p no:cacheprovider \
  > "$OUT/sparse_tests.log" 2>&1
echo "sparse tests rc $? $((SECONDS - s)) s: $(tail -1 "$OUT/sparse_tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/sparse_tests.log" | head -8
[ -f /tmp/s25_h100.json ] || cp profiles/h100.json /tmp/s25_h100.json
cases=${CASES:-"f16:7:64:1,16: bf16:7:64:1,16: f16:7:64:8,32: bf16:7:64:8,32: f16:7:64:2,4: bf16:7:64:2,4:"}
left=$(( ${LIMIT:-560} - (SECONDS - s) - 20 ))
BUDGET_S=$left timeout $(( left + 15 )) python3 bench/session23_prof.py /tmp/s25_h100.json $cases > "$OUT/prof.log" 2>&1
echo "profile rc $? $((SECONDS - s)) s: $(grep -c "was" "$OUT/prof.log") entries"
cp /tmp/s25_h100.json "$OUT/h100.json"
grep -E "M=(1|16):" "$OUT/prof.log" | head -40
