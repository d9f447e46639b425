#!/usr/bin/env bash
# Session 20 A/B, v2 (fast SiLU in the gate|up epilogues): per-stage kernel times and the layer time
# of this tree against the previous kernels (.ab_old/, see ab_moe_epilogue.sh), alternating.
set -uo pipefail
export MIXED_GEMM_CACHE_DIR=/tmp/kcache
[ -d /tmp/site/cutlass_library ] || bash bench/device_run.sh none > "$OUT/setup.log" 2>&1
xz -dc .ab_old/moe_old.txz | tar xf - -C $MIXED_GEMM_CACHE_DIR
for i in 1 2; do
  echo "-- new"; PYTHONPATH=$PWD:/tmp/site python3 bench/diag_moe_stages.py --model mixtral-8x7b --tokens 4096 --reps 10 2>&1 | grep -E "^##|grouped|mg_"
  echo "-- old"; (cd .ab_old && PYTHONPATH=$PWD:/tmp/site python3 diag_moe_stages.py --model mixtral-8x7b --tokens 4096 --reps 10 2>&1 | grep -E "^##|grouped|mg_")
done
OUT=$OUT bash bench/ab_moe_epilogue.sh 2>&1 | tail -30
