#!/usr/bin/env bash
# The bits bench (group 64, gemlite beside), one width per invocation so that each fits what is left
# of LIMIT seconds; results in $OUT/bench-uB.md. Env: BENCH_BITS, BENCH_MS, LIMIT, and
# MIXED_GEMM_PROFILE for a profile other than the shipped one. Sets up the machine with
# bench/s23_env.sh (a no-op where an earlier call did).
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
for b in ${BENCH_BITS:-2 3 7 4}; do
  left=$(( ${LIMIT:-570} - (SECONDS - s) )); [ $left -lt 40 ] && { echo "no time for u$b"; break; }
  timeout $left python3 -m mixed_gemm.cli bench --compare --bits $b --group-size 64 --ms ${BENCH_MS:-1,16} \
    --plot /tmp/bits$b.png --out "$OUT/bench-u$b.md" > "$OUT/bench-u$b.log" 2>&1
  echo "bench u$b rc $? $((SECONDS - s)) s"; grep -A4 "| M | mg" "$OUT/bench-u$b.md" | tail -3
done
