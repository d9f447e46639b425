#!/usr/bin/env bash
# Session 24: the bits bench (M 1 and 16, group 64, gemlite beside) with the shipped profile, one
# width per invocation, on a machine a session24 call has already set up (bench/s23_env.sh).
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
for b in ${BENCH_BITS:-2 3 7 4}; do
  left=$(( ${LIMIT:-570} - (SECONDS - s) )); [ $left -lt 40 ] && { echo "no time for u$b"; break; }
  timeout $left python3 -m mixed_gemm.cli bench --compare --bits $b --group-size 64 --ms ${BENCH_MS:-1,16} \
    --plot /tmp/bits$b.png --out "$OUT/bench-u$b.md" > "$OUT/bench-u$b.log" 2>&1
  echo "bench u$b rc $? $((SECONDS - s)) s"; grep -A4 "| M | mg" "$OUT/bench-u$b.md" | tail -3
done
