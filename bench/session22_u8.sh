#!/usr/bin/env bash
# Session 22 (issue #23 item 4): bf16 int8 g128 profiled at the M the shipped profile lacks (2, 4,
# 128-4096) on the 8 Llama-3 shapes, into a copy of it ($OUT/h100.json). Run on the warm machine of
# the suite (wheels installed, kernel cache unpacked in /tmp/kcache).
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:/tmp/site MIXED_GEMM_CACHE_DIR=/tmp/kcache
cp profiles/h100.json $OUT/h100.json
s=$SECONDS
for ms in 2,4 128,256 512,1024 2048,4096; do
  [ $((SECONDS - s)) -gt ${DEADLINE:-500} ] && break
  timeout $(( ${DEADLINE:-500} + 60 - (SECONDS - s) )) python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b \
    --bits 8 --group-size 128 --dtype bf16 --ms $ms --out $OUT/h100.json --quiet >> $OUT/sweep.log 2>&1
  echo "bf16 u8 M $ms rc $? $((SECONDS - s)) s"
done
tail -3 $OUT/sweep.log
