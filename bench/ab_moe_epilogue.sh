#!/usr/bin/env bash
# Session 20 A/B (issue #24): the MoE layer with SiLU·mul in the gate|up epilogue (this tree) against
# the previous kernels (GEMM to g, then the one-pass silu_mul kernel), alternating in one run.
# The old tree (mixed_gemm/, templates/, profiles/ of the branch head before the change) and its
# moe_sm90a libraries travel as the ignored .ab_old/ (carry it beside the usual cache parts).
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
[ -d /tmp/site/cutlass_library ] || bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
xz -dc .ab_old/moe_old.txz | tar xf - -C $MIXED_GEMM_CACHE_DIR
ARGS="--moe ${PRESETS:-mixtral-8x7b,qwen3-30b-a3b} --tokens ${TOKENS:-256,4096}"
for rep in 1 2 3; do
  PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m mixed_gemm.cli bench $ARGS --out "$OUT/new_$rep.md" > /dev/null 2>&1
  (cd .ab_old && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m mixed_gemm.cli bench $ARGS --out "$OUT/old_$rep.md" > /dev/null 2>&1)
done
for f in "$OUT"/new_*.md "$OUT"/old_*.md; do echo "== $(basename $f)"; grep -E "^\| (mixtral|qwen3)" "$f" | cut -d'|' -f2-5; done
