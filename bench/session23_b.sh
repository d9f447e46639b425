#!/usr/bin/env bash
# Session 23, call 2 of the x-stages experiment: the gemv shapes whose x stages exceed 48 KB (dynamic
# shared memory: m8 u32 and m16 u16 one-strip CTAs) timed against each entry's shipped winner
# (bench/session23_prof.py) into $OUT/h100.json, then the whole GPU suite but the packaged test.
set -uo pipefail
source bench/s23_env.sh
s=$SECONDS
cp profiles/h100.json /tmp/s23b_h100.json
export SHAPES=${SHAPES:-llama3-8b/qkv,llama3-8b/o,llama3-8b/down,llama3-70b/qkv,llama3-70b/o,llama3-70b/down}
cases=""
for dt in f16 bf16; do
  cases="$cases $dt:4:128:1,2,4,8:w1x8_u32_xs $dt:4:128:16:m16_s1_w1x8_u16_xs"
  cases="$cases $dt:8:128:1,2,4,8:m8_s1_w1x8_u16_xs $dt:8:128:16:m16_s1_w1x8_u8_xs"
  for b in 2 3 7; do cases="$cases $dt:$b:64:1,2,4,8:w1x8_u32_xs $dt:$b:64:16:m16_s1_w1x8_u16_xs"; done
done
BUDGET_S=${PROF_BUDGET:-150} timeout 240 python3 bench/session23_prof.py /tmp/s23b_h100.json $cases > "$OUT/prof.log" 2>&1
echo "profile rc $? $((SECONDS - s)) s; entries won by the new shapes:"
cp /tmp/s23b_h100.json "$OUT/h100.json"
grep -E ": gemv:(m8_s1_w1x8_u32_xs|m16_s1_w1x8_u16_xs|m8_s1_w1x8_u16_xs|m16_s1_w1x8_u8_xs)" "$OUT/prof.log" | grep -v "was gemv:m16_s1_w1x8_u8_xs" | head -60
timeout ${SUITE_TIMEOUT:-420} python3 -m pytest -q -m gpu tests -p no:cacheprovider \
  --ignore=tests/ops/test_packaged_gpu.py 2>&1 | tee "$OUT/suite.log" | grep -vE "^[.sxFE]+ *\[" | tail -4
grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
