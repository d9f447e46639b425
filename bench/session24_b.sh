#!/usr/bin/env bash
# Session 24, v2: the low bits' M=1 winners compiled for 3 CTAs per SM (`_o3`, plain and `_ds`).
# Their GPU tests; each `_o3` candidate timed against every entry's shipped winner at M 1-8
# (bench/session23_prof.py) into a copy of the shipped profile; the bits bench (2, 3, 7) with it;
# then the whole GPU suite but the packaged test, in the time left.
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
timeout 120 python3 -m pytest -q -m gpu tests/ops/test_lowbit_gpu.py -k "o3" -p no:cacheprovider > "$OUT/lowbit_o3.log" 2>&1
echo "lowbit o3 tests rc $? $((SECONDS - s)) s: $(tail -1 "$OUT/lowbit_o3.log")"
cp profiles/h100.json /tmp/s24b_h100.json
cases=""; for dt in f16 bf16; do for b in 2 3 7; do cases="$cases $dt:$b:64:1,2,4,8:_o3"; done; done
BUDGET_S=${PROF_BUDGET:-150} timeout 200 python3 bench/session23_prof.py /tmp/s24b_h100.json $cases > "$OUT/prof.log" 2>&1
echo "profile rc $? $((SECONDS - s)) s; $(grep -c was "$OUT/prof.log") sweeps"
cp /tmp/s24b_h100.json "$OUT/h100.json"
MIXED_GEMM_PROFILE=/tmp/s24b_h100.json BENCH_BITS="2 3 7" LIMIT=200 bash bench/bits_bench.sh
rm -f "$OUT"/bench-u*.log
left=$(( ${LIMIT:-575} - (SECONDS - s) ))
echo "suite: $left s left"
timeout $left python3 -m pytest -q -m gpu tests -p no:cacheprovider --ignore=tests/ops/test_packaged_gpu.py \
  > "$OUT/suite.log" 2>&1
echo "suite rc $?: $(tail -1 "$OUT/suite.log")"; grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -10
grep "M=1:" "$OUT/prof.log" | head -48
