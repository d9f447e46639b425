#!/usr/bin/env bash
# Session 23, profile call: the catalog's new gemv shapes (lowbit m8 u32 one-step CTAs, the one-strip
# 16-token kernel for the low bits, its deferred int4/int8 form) timed against each entry's shipped
# winner (bench/session23_prof.py) into /tmp/s23_h100.json (a copy of the shipped profile), fp16
# first; then the bits bench at M 1 and 16 with that profile, one width per invocation.
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
[ -f /tmp/s23_h100.json ] || cp profiles/h100.json /tmp/s23_h100.json
export SHAPES=${SHAPES:-llama3-8b/qkv,llama3-8b/o,llama3-8b/down,llama3-70b/qkv,llama3-70b/o,llama3-70b/down}
cases=""
for dt in f16 bf16; do
  for b in 2 3 7; do cases="$cases $dt:$b:64:16:m16_s1_w1x8"; done
  cases="$cases $dt:4:128:16:m16_s1_w1x8_u8_xs_ds"
  for b in 2 3 7; do cases="$cases $dt:$b:64:1,8:w1x8_u32"; done
done
BUDGET_S=${PROF_BUDGET:-250} timeout $(( ${PROF_BUDGET:-250} + 60 )) python3 bench/session23_prof.py /tmp/s23_h100.json $cases \
  > "$OUT/prof.log" 2>&1
echo "profile rc $? $((SECONDS - s)) s"; grep -c "was" "$OUT/prof.log"
cp /tmp/s23_h100.json "$OUT/h100.json"
export MIXED_GEMM_PROFILE=/tmp/s23_h100.json
BENCH_BITS=${BENCH_BITS:-2 3 7 4} LIMIT=$(( ${LIMIT:-570} - (SECONDS - s) )) bash bench/bits_bench.sh
tail -70 "$OUT/prof.log"
