#!/usr/bin/env bash
# Everything tensor parallel on a two-GPU machine (nvidia-h100-x2) in one call of at most ten
# minutes: build the kernels, the two-GPU tests, bench/tp_decode.py's check + all-reduce sizes +
# row-parallel layers, then its decode-step table (80 layers of Llama-3-70B), and a second table
# (batch 64, torch.compile) only if time remains. NVLink multicast off. Everything is tee'd into
# $OUT; a short summary comes last. TP2_WORLD=4 runs the same at TP=4 on a four-GPU machine
# (nvidia-h100-x4); the tests part stays the two-GPU tests, whose TP=2 kernels the build part then
# leaves to the JIT (TP2_PARTS=build,bench,step,more skips them).
#
#   source bench/device/env.sh && bash bench/device/tp2_all.sh      # from the repository root
#   TP2_WORLD=4 bash bench/device/tp2_all.sh                         # TP=4 (four GPUs)
#
# Knobs (environment, with defaults):
#   TP2_WORLD=2             the tensor-parallel size: torchrun's --nproc-per-node, the GPUs needed
#   TP2_BUDGET=540          seconds for the whole script; each part gets at most what is left
#   TP2_PARTS=build,tests,bench,step,more   the parts to run, in this order
#   TP2_BUILD_TIMEOUT=150   kernels for the TP=1/TP=$TP2_WORLD shapes at M 1..64, the all-reduce kernels
#                           (f16/bf16/f32) and the fused gemv all-reduce kernels, TP2_JOBS nvcc at once
#   TP2_TESTS="tests/integrations/test_tp_allreduce_gpu.py tests/integrations/test_tp_gpu.py"
#   TP2_TEST_TIMEOUT=300    the two-GPU pytest run (eight tests; at 220 s the last, the short decode bench, was cut)
#   TP2_BENCH_TIMEOUT=120   tp_decode.py --skip tp1,tp2 (check, all-reduce sizes, row-parallel layers)
#   TP2_LAYERS=80 TP2_BATCHES=1,16 TP2_COMPILE=0 TP2_MODES=nccl,ours,fused,gemm_fused   the step table
#   TP2_STEP_SKIP=check,micro,gemm   (add tp1 to time TP=2 only: no TP=1 model to build)
#   TP2_MORE_BATCHES=64 TP2_MORE_COMPILE=0,1 TP2_MORE_SKIP=check,micro,gemm,tp1   the second table,
#   TP2_MORE_MIN=150        run only when at least this many seconds are left
#   TP2_DECODE_ARGS=""      more tp_decode.py arguments for every run (--preset tiny: a CPU dry run)
# The kernel cache ($MIXED_GEMM_CACHE_DIR, /tmp/kcache) outlives a call on a warm machine, so a
# second call (TP2_PARTS=step,more) finds the kernels built.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MIXED_GEMM_JIT=block  # compile what selection picks before running it, never a stand-in
QUIET='Warning|warn\('
PROGRESS='^[.sxFE]+ *\['

WORLD=${TP2_WORLD:-2}
[[ $WORLD =~ ^[0-9]+$ ]] && [ "$WORLD" -ge 2 ] || { echo "tp2_all: TP2_WORLD must be an integer >= 2, got $WORLD"; exit 2; }
BUDGET=${TP2_BUDGET:-540}
PARTS=",${TP2_PARTS:-build,tests,bench,step,more},"
LAYERS=${TP2_LAYERS:-80}
BATCHES=${TP2_BATCHES:-1,16}
MODES=${TP2_MODES:-nccl,ours,fused,gemm_fused}
END=$((SECONDS + BUDGET))
SUMMARY=()

left() { echo $((END - SECONDS)); }
# limit DEFAULT: the smaller of DEFAULT and what is left but a few seconds for the summary (>= 1:
# `timeout 0` would mean no limit)
limit() { local l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; [ "$l" -ge 1 ] || l=1; echo $l; }
# want PART: asked for, and at least 30 s left for it
want() {
  [[ $PARTS == *",$1,"* ]] || return 1
  [ "$(left)" -ge 30 ] && return 0
  note "$1: skipped, $(left) s left"
  return 1
}
note() { SUMMARY+=("$1"); echo "-- $1"; }

# shellcheck disable=SC2086  # TP2_DECODE_ARGS is a list of arguments
torchrun_decode() {  # torchrun_decode LOG TIMEOUT ARGS...: bench/tp_decode.py on $WORLD GPUs
  local log=$1 t=$2
  shift 2
  timeout "$t" python3 -m torch.distributed.run --nproc-per-node "$WORLD" bench/tp_decode.py \
    --time-limit $((t - 5)) "$@" ${TP2_DECODE_ARGS:-} 2>&1 | grep -vE "$QUIET" | tee "$OUT/$log"
  return "${PIPESTATUS[0]}"
}

echo "== tp2_all: TP=$WORLD, budget $BUDGET s, parts ${PARTS//,/ }"
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -4
[ "$(nvidia-smi -L | wc -l)" -ge "$WORLD" ] || { echo "tp2_all: TP2_WORLD=$WORLD needs $WORLD GPUs (two: the nvidia-h100-x2 kind, four: nvidia-h100-x4)"; exit 2; }

if want build; then
  s=$SECONDS
  echo "== build"
  TP2_BATCHES=$BATCHES TP2_MORE_BATCHES=${TP2_MORE_BATCHES:-64} timeout "$(limit "${TP2_BUILD_TIMEOUT:-150}")" \
    python3 - "${TP2_JOBS:-16}" "$WORLD" <<'EOF' 2>&1 | grep -vE "$QUIET" | tee "$OUT/tp2-build.log"
# The kernels the two-GPU tests and bench/tp_decode.py select, built in parallel before anything
# times them: the Llama-3-70B projections at TP=1 and TP=world (int4 g128 fp16, the layout prepack
# picks here) at M 1..64 and the runs' batches, the fused gemv all-reduce kernels of the
# row-parallel ones (TP=world), and every all-reduce kernel of world ranks.
import os, sys, time
import torch
import mixed_gemm as mg
from mixed_gemm.integrations.e2e import PRESETS
from mixed_gemm.compile import blocking, build_specs
from mixed_gemm.ops.prebuild import all_reduce_specs

t0 = time.time()
p = PRESETS["llama3-70b"]
h, inter, heads, kv = p["hidden_size"], p["intermediate_size"], p["num_attention_heads"], p["num_key_value_heads"]
d = h // heads
ms = {1, 2, 4, 8, 16, 32, 64}
for var in ("TP2_BATCHES", "TP2_MORE_BATCHES"):
    ms |= {int(b) for b in os.environ.get(var, "").split(",") if b}
jobs, world = int(sys.argv[1]), int(sys.argv[2])
weights, rows = [], []
for tp in (1, world):
    for n, k, row in (((heads + 2 * kv) * d // tp, h, False), (h, heads * d // tp, True), (2 * inter // tp, h, False),
                      (h, inter // tp, True)):
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8, device="cuda")
        s = torch.rand(n, k // 128, generator=gen, device="cuda").half() * 0.01 + 0.001
        z = torch.randint(0, 16, (n, k // 128), generator=gen, device="cuda").half()
        w = mg.prepack(q, s, z, format="plain", bits=4, group_size=128, dtype=torch.float16)
        (rows if tp == world and row else weights).append(w)
        del q, s, z
built = mg.prebuild(weights, sorted(ms), world=world, row_parallel=rows, jobs=jobs)
with blocking():
    built += len(build_specs(all_reduce_specs((torch.float16, torch.bfloat16, torch.float32), world), jobs=jobs))
print(f"built {built} kernels in {time.time() - t0:.0f} s")
EOF
  rc=${PIPESTATUS[0]}
  note "build: rc $rc, $((SECONDS - s)) s; $(tail -1 "$OUT/tp2-build.log")"
fi

if want tests; then
  s=$SECONDS
  echo "== tests"
  # shellcheck disable=SC2086  # TP2_TESTS is a list of paths
  timeout "$(limit "${TP2_TEST_TIMEOUT:-300}")" python3 -m pytest -q -m gpu -p no:cacheprovider \
    ${TP2_TESTS:-tests/integrations/test_tp_allreduce_gpu.py tests/integrations/test_tp_gpu.py} 2>&1 \
    | tee "$OUT/tp2-tests.log" | grep -vE "$PROGRESS|$QUIET" | tail -30
  rc=${PIPESTATUS[0]}
  note "tests: rc $rc, $((SECONDS - s)) s; $(grep -E "passed|failed|error" "$OUT/tp2-tests.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$OUT/tp2-tests.log" | head -10 | while read -r line; do note "  $line"; done
fi

if want bench; then
  s=$SECONDS
  echo "== bench: check, all-reduce sizes, row-parallel layers"
  torchrun_decode tp2-bench.log "$(limit "${TP2_BENCH_TIMEOUT:-120}")" --skip tp1,tp2 --batches "$BATCHES" \
    --modes "$MODES" > /dev/null
  rc=$?
  grep -E "^\| " "$OUT/tp2-bench.log" | tail -40
  note "bench: rc $rc, $((SECONDS - s)) s; $(tail -1 "$OUT/tp2-bench.log")"
fi

if want step; then
  s=$SECONDS
  t=$(limit "$(left)")
  echo "== step: $LAYERS layers, batches $BATCHES, compile ${TP2_COMPILE:-0} ($t s)"
  torchrun_decode tp2-step.log "$t" --skip "${TP2_STEP_SKIP:-check,micro,gemm}" --layers "$LAYERS" \
    --batches "$BATCHES" --compile "${TP2_COMPILE:-0}" --modes "$MODES" | grep -E "built|^row: |^\| TP=$WORLD .* speedup|PASS|FAIL|Error"
  rc=${PIPESTATUS[0]}
  note "step: rc $rc, $((SECONDS - s)) s"
fi

if want more; then
  if [ "$(left)" -ge "${TP2_MORE_MIN:-150}" ]; then
    s=$SECONDS
    t=$(limit "$(left)")
    echo "== more: $LAYERS layers, batches ${TP2_MORE_BATCHES:-64}, compile ${TP2_MORE_COMPILE:-0,1} ($t s)"
    torchrun_decode tp2-more.log "$t" --skip "${TP2_MORE_SKIP:-check,micro,gemm,tp1}" --layers "$LAYERS" \
      --batches "${TP2_MORE_BATCHES:-64}" --compile "${TP2_MORE_COMPILE:-0,1}" --modes "$MODES" \
      | grep -E "built|^row: |^\| TP=$WORLD .* speedup|PASS|FAIL|Error"
    rc=${PIPESTATUS[0]}
    note "more: rc $rc, $((SECONDS - s)) s"
  else
    note "more: skipped, $(left) s left (TP2_MORE_MIN=${TP2_MORE_MIN:-150})"
  fi
fi

echo
echo "== summary ($SECONDS s; logs in $OUT/tp2-*.log)"
for line in "${SUMMARY[@]}"; do echo "$line"; done
# The rows that answer the questions: checks, the 16 KB all-reduce, fused layers, step and shares.
# (TP=1/TP=N speedups come only with the final table, when a run finishes.)
cat "$OUT"/tp2-bench.log "$OUT"/tp2-step.log "$OUT"/tp2-more.log 2>/dev/null \
  | grep -E "^row: \| (check|all-reduce 16 KB|o_proj|down_proj|decode step|all-reduce share)|^\| TP=$WORLD .* speedup" \
  | sed 's/^row: //' | cut -c1-200
