#!/usr/bin/env bash
# Session 26, call A (carry .whl, .kpkg): the JIT-off package test, then issue #23's bench with the
# package installed (JIT off), fp16 and bf16: `bench --compare --ms 1,2,4,8,16,32,64,256,4096`.
set -uo pipefail
source bench/s23_env.sh
[ -d /tmp/kpkg/mixed_gemm_kernels_sm90a ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kpkg .kpkg/*.whl
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
if [ "${PKG_TEST:-1}" = 1 ]; then
  MIXED_GEMM_KERNEL_WHEEL=$(ls $PWD/.kpkg/*.whl) timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -s -m gpu \
    tests/ops/test_packaged_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/packaged.log" | grep -E "packaged:|passed|failed" | tail -3
  echo "packaged test: $((SECONDS - s)) s"
fi
for dt in ${DTYPES:-f16 bf16}; do
  PYTHONPATH=$PYTHONPATH:/tmp/kpkg MIXED_GEMM_JIT=0 timeout ${BENCH_TIMEOUT:-210} python3 -m mixed_gemm.cli bench --compare \
    --model llama3-8b,llama3-70b --ms 1,2,4,8,16,32,64,256,4096 --dtype $dt --out "$OUT/bench-$dt.md" \
    --json "$OUT/bench-$dt.json" --plot "$OUT/bench-$dt.png" > "$OUT/bench-$dt.log" 2>&1
  echo "bench $dt rc $? $((SECONDS - s)) s"; grep -E "^\| (1|2|4|8|16|32|64|256|4096) \|" "$OUT/bench-$dt.md" | head -9
done
