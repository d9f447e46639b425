#!/usr/bin/env bash
# Session 23: the M=1 latency floor of the low bits (bench/latency_floor.py: an empty kernel, a pure
# Triton read of the packed bytes, mg.matmul) on the 8B o/qkv and 70B o/qkv shapes, g64.
set -uo pipefail
source bench/s23_env.sh
for b in ${FLOOR_BITS:-4 2 3 7}; do
  echo "== bits $b"
  timeout 120 python3 bench/latency_floor.py --bits $b --group-size 64 \
    --shapes ${FLOOR_SHAPES:-4096:4096,6144:4096,8192:8192,10240:8192} 2>&1 | grep -v Warning
done
