#!/usr/bin/env bash
# Session 25 v2 (1:2-sparse rings whose x stage 8 N-warps share): those candidates timed against
# each 7-bit entry's shipped winner at M 8, 16, 32 (bench/session23_prof.py) into /tmp/s25b.json;
# the bits bench of 7 bits with it; then that profile in place of the shipped one and the whole GPU
# suite (but the packaged test) after this last kernel change.
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
[ -f /tmp/s25b.json ] || cp profiles/h100.json /tmp/s25b.json
sub="w8x1_u8_p3|w8x1_u4_p3|w8x2_u4_p3|w8x1_u4_p2"
BUDGET_S=120 timeout 150 python3 bench/session23_prof.py /tmp/s25b.json f16:7:64:16,8,32:"$sub" bf16:7:64:16,8,32:"$sub" \
  > "$OUT/prof_b.log" 2>&1
echo "profile rc $? $((SECONDS - s)) s: $(grep -c "was" "$OUT/prof_b.log") entries"
cp /tmp/s25b.json "$OUT/h100.json"
MIXED_GEMM_PROFILE=/tmp/s25b.json BENCH_BITS=7 LIMIT=120 bash bench/bits_bench.sh
cp /tmp/s25b.json profiles/h100.json
SUITE_TIMEOUT=$(( 585 - (SECONDS - s) )) bash bench/session23_suite.sh
grep -E "M=16:" "$OUT/prof_b.log" | head -20
