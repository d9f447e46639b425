#!/usr/bin/env bash
# Session 21, call 2 (issue #26): the low-bit catalog's new M=1 shapes (w8x1, w1x8, w2x8, plain and
# deferred). Builds every 2/3/7-bit catalog kernel, re-sweeps 2, 3 and 1:2-sparse 7 bits at M 1-8
# (fp16, bf16) into a copy of the shipped profile ($OUT/h100.json).
set -uo pipefail
export PYTHONUNBUFFERED=1
T=/tmp/site
[ -d $T/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $T .whl/*.whl
export PYTHONPATH=$PWD:$T MIXED_GEMM_CACHE_DIR=/tmp/kcache
s=$SECONDS
for f in _u2_ _u3_ _u7_; do python3 -m mixed_gemm.cli build --all --filter $f --jobs 16 --quiet 2>&1 | tail -1; done
echo "build $((SECONDS - s)) s"
cp profiles/h100.json $OUT/h100.json
for b in 2 3 7; do for dt in f16 bf16; do
  timeout 200 python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --bits $b --group-size 64 --ms 1,2,4,8 \
    --dtype $dt --out $OUT/h100.json --quiet > $OUT/sweep_u${b}_$dt.log 2>&1; echo "u$b $dt rc $? $((SECONDS - s)) s"
done; done
