#!/usr/bin/env bash
# Session 26, call B (after A on the same machine): issue #26's bench with the package installed (JIT
# off): `bench --compare --bits 2,3,4,7 --group-size 64 --ms 1,16`, gemlite beside where it has the width.
set -uo pipefail
source bench/s23_env.sh
[ -d /tmp/kpkg/mixed_gemm_kernels_sm90a ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kpkg .kpkg/*.whl
s=$SECONDS
PYTHONPATH=$PYTHONPATH:/tmp/kpkg MIXED_GEMM_JIT=0 timeout ${BENCH_TIMEOUT:-560} python3 -m mixed_gemm.cli bench --compare \
  --bits ${BENCH_BITS:-2,3,4,7} --group-size 64 --ms ${BENCH_MS:-1,16} --out "$OUT/bench-bits.md" \
  --json "$OUT/bench-bits.json" --plot "$OUT/bench-bits.png" > "$OUT/bench-bits.log" 2>&1
echo "bench bits rc $? $((SECONDS - s)) s"; grep -E "^# mg|^\| (1|16) \|" "$OUT/bench-bits.md" | sed "s/ — NVIDIA.*bandwidth/ bw/" | head -12
