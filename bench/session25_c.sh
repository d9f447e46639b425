#!/usr/bin/env bash
# Session 25 v3 (branch s25-ldmatrix-x: the staged-x gemv kernels read two atoms' B fragments per
# ldmatrix.x4): the whole GPU suite but the packaged test, then the bits bench of 7 and 2 bits at
# M 1 and 16 with the shipped profile, to compare with v2's run of the same session.
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
SUITE_TIMEOUT=330 bash bench/session23_suite.sh
BENCH_BITS="${BENCH_BITS:-7 2}" LIMIT=$(( 570 - (SECONDS - s) )) bash bench/bits_bench.sh
