#!/usr/bin/env bash
# Where one sm90a library's build goes (issue #22): its device pass and host pass, each alone with
# nvcc --time (CSV per phase) under /usr/bin/time -v, as compile_shared runs them.
# Usage: bash bench/compile_phases.sh [KERNEL] [SPLIT_THREADS]   (logs to $OUT/phases-*)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=${1:-mg_sm90a_f16_u4_t128x128x128_coop_c1x1_s0_sk}; threads=${2:-1}
flags=$(python3 -c "
from mixed_gemm.compile.nvcc import compile_flags, OUTPUTS
from mixed_gemm.kernels import family
print(' '.join(f for f in compile_flags(arch_flags=family('sm90a').arch_flags, output='shared') if f not in OUTPUTS['shared'][0]))")
src=generated/$name.cu; tmp=$(mktemp -d)
/usr/bin/time -v nvcc $flags --fatbin -split-compile=$threads --time "$OUT/phases-device.csv" -o $tmp/d.fatbin $src \
  > "$OUT/phases-device.log" 2>&1 &
/usr/bin/time -v nvcc $flags -c -Xcompiler=-fPIC -DMIXED_GEMM_HOST_PASS --time "$OUT/phases-host.csv" -o $tmp/h.o $src \
  > "$OUT/phases-host.log" 2>&1
wait
for p in device host; do
  echo "== $p pass: $(grep -E 'Elapsed' "$OUT/phases-$p.log" | awk '{print $NF}') wall, $(grep -E 'Maximum resident' "$OUT/phases-$p.log" | awk '{print $NF}') KB"
  cut -d, -f2,7 "$OUT/phases-$p.csv" | tail -n +2 | awk -F, '$2 > 100 {printf "  %-26s %8.1f s\n", $1, $2/1000}'
done
