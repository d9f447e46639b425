#!/usr/bin/env bash
# Session 22, call 2: the bits bench (`mixed-gemm bench --compare --bits 2,3,4,7 --group-size 64
# --ms 1,16`, gemlite beside) with the profile of call 1 (left in /tmp by it; else the shipped one).
# Carry what call 1 carried: on the warm machine of call 1 nothing is unpacked again.
set -uo pipefail
source bench/s22_env.sh
[ -f /tmp/s22_h100.json ] && export MIXED_GEMM_PROFILE=/tmp/s22_h100.json
echo "profile: ${MIXED_GEMM_PROFILE:-shipped}"
timeout ${BENCH_TIMEOUT:-420} python3 -m mixed_gemm.cli bench --compare --bits ${BENCH_BITS:-2,3,4,7} --group-size 64 \
  --ms ${BENCH_MS:-1,16} --plot /tmp/bits.png --out "$OUT/bench-bits.md" 2>&1 | tee "$OUT/bench-bits.log" | tail -14
