#!/usr/bin/env bash
# One GPU-machine session: install the carried wheels, show the environment, run the whole test
# suite and the benchmark. Logs go to $OUT. Usage: bash bench/device_run.sh [tests] [bench-cli] [sass] ...
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=/tmp/site
# The wheels once per machine (a later call on the same warm machine need not carry them again).
[ -d $T/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $T .whl/*.whl || exit 1
export PYTHONPATH=$PWD:$T
export MIXED_GEMM_CACHE_DIR=${MIXED_GEMM_CACHE_DIR:-$PWD/.kcache}
# A kernel cache built earlier (same nvcc and CUTLASS) travels as kcache/*.tgz: entries verify and load.
if ls kcache/kcache.tgz.part-* >/dev/null 2>&1 && [ ! -d "$MIXED_GEMM_CACHE_DIR" ]; then
  mkdir -p "$MIXED_GEMM_CACHE_DIR" && cat kcache/kcache.tgz.part-* | tar xzf - -C "$MIXED_GEMM_CACHE_DIR"; fi
# sm90a kernel libraries (1 MB each, mostly the same static cudart: xz over the tar dedupes them).
if ls kcache/kcache90.txz.part-* >/dev/null 2>&1; then
  mkdir -p "$MIXED_GEMM_CACHE_DIR" && cat kcache/kcache90.txz.part-* | xz -dc | tar xf - -C "$MIXED_GEMM_CACHE_DIR"; fi
# Every catalog fatbin (kcache/rest.txz; the sm90a libraries are the txz parts above).
# (and any other kcache/*.txz: entries built since, for the kernels a session changed).
for f in kcache/*.txz; do [ -f "$f" ] && mkdir -p "$MIXED_GEMM_CACHE_DIR" && xz -dc "$f" | tar xf - -C "$MIXED_GEMM_CACHE_DIR"; done
# The kernel package: the packaged test installs it itself (MIXED_GEMM_KERNEL_WHEEL); the benchmark
# steps find it in /tmp/kpkg (with_pkg), the suite runs without it.
if ls .kpkg/*.whl >/dev/null 2>&1; then
  export MIXED_GEMM_KERNEL_WHEEL=$(ls $PWD/.kpkg/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kpkg .kpkg/*.whl; fi
with_pkg() { PYTHONPATH=$PYTHONPATH:/tmp/kpkg "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m mixed_gemm.cli info 2>&1 | tee "$OUT/info.txt"
steps=${*:-tests bench-cli}
for step in $steps; do
  case $step in
    tests) python3 -m pytest -q -rs tests 2>&1 | tee "$OUT/pytest.log" | grep -vE "^\s*$" | tail -25 ;;
    gpu-tests) python3 -m pytest -q -m gpu -x tests 2>&1 | tee "$OUT/pytest-gpu.log" | tail -25 ;;
    suite)  # the whole GPU suite, no -x: the summary line an issue quotes (~5-6 min with a carried cache)
      timeout ${SUITE_TIMEOUT:-450} python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 \
        | tee "$OUT/suite.log" | grep -vE "^[.sxFE]+ *\[" | tail -20 ;;
    new-tests) python3 -m pytest -q -x tests/ops/test_config_space_gpu.py 2>&1 | tee "$OUT/pytest-new.log" | tail -25 ;;
    bench-dequant) python3 bench/bench_matmul.py --mode dequant --out "$OUT/bench-dequant.md" 2>&1 | tail -10 ;;
    bench-splitk) python3 bench/bench_matmul.py --mode splitk --ms 1,16 --out "$OUT/bench-splitk.md" 2>&1 | tail -20 ;;
    build) python3 -m mixed_gemm.cli build --quiet 2>&1 | tail -3 ;;
    build-one)  # one sm90a library alone, in a cache of its own (issue #22: seconds and peak compiler memory)
      MIXED_GEMM_CACHE_DIR=/tmp/one-cache /usr/bin/time -v python3 -m mixed_gemm.cli build \
        --filter ${ONE_FILTER:-mg_sm90a_f16_u4_t128x128x128_coop_c1x1_s0_sk} --jobs 1 \
        --quiet 2>&1 | tee "$OUT/build-one.log" | grep -E "kernels in|Elapsed|Maximum resident" ;;
    build-all)  # what `mixed-gemm build` compiles on this GPU, every core (issue #22's "full build" figure)
      /usr/bin/time -v timeout ${BUILD_TIMEOUT:-500} python3 -m mixed_gemm.cli build --jobs ${BUILD_JOBS:-16} --quiet 2>&1 \
        | tee "$OUT/build-all.log" | grep -E "kernels in|Elapsed|Maximum resident|rror" ;;
    package)  # the sm90a kernel package from the cache just built (the wheel comes back in 15 MB parts)
      rm -rf .kpkg && /usr/bin/time -v python3 -m mixed_gemm.cli build --package .kpkg --arch sm90a --quiet 2>&1 \
        | tee "$OUT/package.log" | grep -E "kernels|Elapsed"
      ls -la .kpkg/*.whl && split -b 15M .kpkg/*.whl "$OUT/kpkg.whl.part-" ;;
    suite-rest)  # the GPU suite but the packaged test (run beside it as `packaged`)
      timeout ${SUITE_TIMEOUT:-560} python3 -m pytest -q -m gpu tests -p no:cacheprovider \
        --ignore=tests/ops/test_packaged_gpu.py 2>&1 | tee "$OUT/suite.log" | grep -vE "^[.sxFE]+ *\[" | tail -20 ;;
    packaged)  # JIT off, package installed, nvcc and CUTLASS hidden (README API, Llama shapes, bench, e2e)
      MIXED_GEMM_KERNEL_WHEEL=$(ls $PWD/.kpkg/*.whl) timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -q -s -m gpu \
        tests/ops/test_packaged_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/packaged.log" | grep -vE "Warning|warn\(" | tail -30 ;;
    cold-call) timeout ${COLD_TIMEOUT:-400} python3 bench/cold_call.py --wheel $(ls $PWD/.kpkg/*.whl) --out "$OUT/cold-call.md" \
                 2>&1 | tail -8 ;;
    build-sm90a)  # every sm90a catalog library (the profiler's and the suite's, beyond what selection picks)
      /usr/bin/time -f "%e s wall" timeout ${BUILD_TIMEOUT:-480} python3 -m mixed_gemm.cli build --all \
        --filter ${BUILD_FILTER:-mg_sm90a} --jobs 16 --quiet 2>&1 | tail -3 ;;
    pack-sm90a)  # the sm90a libraries, in parts under the 16 MB return limit (carried back as kcache/)
      (cd "$MIXED_GEMM_CACHE_DIR" && tar cf - --exclude='*.lock' mg_sm90a_*) | xz -9 -T0 | split -b 15M - "$OUT/kcache90.txz.part-"
      ls -la "$OUT"/kcache90.txz.part-* ;;
    sm80-90a-tests)  # issue #23: the sm80 tiles on the one copy (every catalog kernel, split-K, graphs)
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -x tests/ops/test_sm80_sm90a_layout_gpu.py 2>&1 \
        | tee "$OUT/pytest-sm80-90a.log" | tail -8 ;;
    bench-ms)  # mixed-gemm bench --compare at BENCH_MS with the profile in $OUT (a profile-merge before it)
      MIXED_GEMM_PROFILE=$( [ -f "$OUT/h100.json" ] && echo "$OUT/h100.json" || echo profiles/h100.json ) \
        timeout ${BENCH_TIMEOUT:-300} python3 -m mixed_gemm.cli bench --compare --dtype ${BENCH_DTYPE:-f16} \
        --ms ${BENCH_MS:-1,2,4,8,16,32,64,256,4096} --out "$OUT/bench-${BENCH_DTYPE:-f16}.md" --json "$OUT/bench-${BENCH_DTYPE:-f16}.json" \
        --plot /tmp/bench.png 2>&1 | tail -14 ;;
    sm90a-tests) timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -x ${SM90A_TESTS:-tests/ops/test_sm90a_gpu.py} 2>&1 \
                   | tee "$OUT/pytest-sm90a.log" | tail -25 ;;
    profile-merge)  # the 8 Llama-3 shapes at PROFILE_MS, every family's candidates, merged into a copy
      # of the shipped profile ($OUT/h100.json; resumable from a carried profiles/h100.partial.jsonl)
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      [ -f profiles/h100.partial.jsonl ] && cp profiles/h100.partial.jsonl "$OUT/"
      timeout ${PROFILE_TIMEOUT:-300} python3 -m mixed_gemm.cli profile --model ${PROFILE_MODELS:-llama3-8b,llama3-70b} \
        --ms ${PROFILE_MS:-64,256,4096} --dtype ${PROFILE_DTYPE:-f16} --out "$OUT/h100.json" --quiet 2>&1 | tail -5
      echo "profile exit: $?" ;;
    pack-cache)  # fatbin entries only (sm90a libraries: pack-sm90a), in pieces under the 16 MB return limit
      (cd "$MIXED_GEMM_CACHE_DIR" && tar czf - --exclude='*.lock' --exclude='mg_sm90a_*' .) | split -b 15M - "$OUT/kcache.tgz.part-"
      ls -la "$OUT"/kcache.tgz.part-* ;;
    serving-tests) timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -x tests/integrations/test_compiled_generation_gpu.py \
                     tests/ops/test_families_gpu.py tests/nn 2>&1 | tee "$OUT/pytest-serving.log" | tail -25 ;;
    bench-small) python3 -m mixed_gemm.cli bench --shapes 4096:4096,1024:4096 --ms 1,16 --json "$OUT/bench-small.json" \
                   2>&1 | tail -8 ;;
    profile-new)  # the shapes the shipped profile lacks: unfused presets and Qwen2.5
      timeout ${PROFILE_TIMEOUT:-300} python3 -m mixed_gemm.cli profile --model ${PROFILE_MODELS:-llama3-8b-unfused,llama3-70b-unfused,qwen2.5-7b,qwen2.5-7b-unfused} \
        --ms 1,2,4,8,16,32,64,128,256 --out "$OUT/h100-new.json" --no-merge --quiet 2>&1 | tail -5
      echo "profile exit: $?" ;;
    heldout)  # shapes no preset has: how close selection (nearest profiled shape) gets to their best
      timeout ${HELDOUT_TIMEOUT:-150} python3 -m mixed_gemm.cli profile --shapes 5120:5120,13824:5120,5120:13824,2048:2048,3072:3072 \
        --ms 1,4,16,64,256 --out "$OUT/heldout.json" --no-merge --quiet 2>&1 | tail -3
      python3 bench/heldout_check.py --csv "$OUT/heldout.csv" --out "$OUT/heldout.md" | tail -12 ;;
    heldout-untimed)  # time the schedules selection picks that the shipped held-out sweep did not try
      python3 bench/heldout_check.py | grep "^untimed:" | sed 's/^untimed: mixed-gemm profile //' | while read -r a; do
        python3 -m mixed_gemm.cli profile $a --out "$OUT/untimed.json" --quiet 2>&1 | tail -1
        grep -h "success" "$OUT"/untimed.csv | cut -d, -f7-9,15,21 | tee -a "$OUT/untimed-all.txt"; done ;;
    decode-profile) with_pkg timeout ${DECODE_TIMEOUT:-300} python3 bench/profile_decode.py --layers ${DECODE_LAYERS:-32} \
                      --batch ${DECODE_BATCH:-1} --json "$OUT/decode-profile-b${DECODE_BATCH:-1}.json" 2>&1 \
                      | grep -vE "Warning|warn\(" | tee "$OUT/decode-profile-b${DECODE_BATCH:-1}.md" | tail -40 ;;
    bench-moe)  # issue #24: one MoE layer per preset, mg.moe vs the best dense path and the int4 floor
      with_pkg timeout ${BENCH_TIMEOUT:-400} python3 -m mixed_gemm.cli bench --moe ${MOE_MODELS:-mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite} \
        --tokens ${MOE_TOKENS:-1,4,16,64,256,4096} --out "$OUT/bench-moe.md" --json "$OUT/bench-moe.json" 2>&1 | tail -22 ;;
    tp2)  # issue #27 on nvidia-h200-x2: the two-GPU test (torchrun, NCCL, NVLink multicast off)
      nvidia-smi topo -m 2>&1 | head -5
      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout ${TP_TIMEOUT:-500} python3 -m pytest -q -s -m gpu \
        tests/integrations/test_tp_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/tp2.log" | grep -vE "Warning|warn\(" | tail -30 ;;
    gated)  # issue #25: SiLU·mul in the gate|up epilogue (GPU tests, the op alone, the 8B step on/off)
      timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -x tests/ops/test_gated_gpu.py -p no:cacheprovider 2>&1 | tail -3
      timeout ${GATED_TIMEOUT:-300} python3 bench/bench_gated.py --out "$OUT/gated.md" 2>&1 | grep -vE "Warning|warn\(" | tail -16 ;;
    ppl) timeout ${PPL_TIMEOUT:-200} python3 bench/perplexity.py --out "$OUT/ppl.md" 2>&1 | grep -vE "Warning|warn\(" | tail -14 ;;
    e2e-smoke) with_pkg timeout ${E2E_TIMEOUT:-300} python3 -m mixed_gemm.cli e2e --layers ${E2E_LAYERS:-4} \
                 --batches ${E2E_BATCHES:-1,16} --reps ${E2E_REPS:-1} ${E2E_ARGS:-} --json "$OUT/e2e.json" --plot "$OUT/e2e.png" \
                 --out "$OUT/e2e.md" 2>&1 | grep -vE "Warning|warn\(" | tail -20 ;;
    quick-gpu) python3 -m pytest -q -x -m gpu tests/ops/test_config_space_gpu.py tests/profiler tests/select 2>&1 \
                 | tee "$OUT/pytest-quick.log" | tail -15 ;;
    profile)  # resumable: a partial sweep left in $OUT by a cut-off run is carried back as profiles/
      [ -f profiles/h100.partial.jsonl ] && cp profiles/h100.partial.jsonl "$OUT/"
      timeout ${PROFILE_TIMEOUT:-420} python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --out "$OUT/h100.json" \
        --no-merge --quiet 2>&1 | tail -5
      echo "profile exit: $?" ;;
    e2e) python3 bench/e2e_smollm2.py --out "$OUT" 2>&1 | grep -vE "Warning|warn" | tail -20 ;;
    bench-bits)  # issue #15's table: every width at M=1 and 16 (gemlite beside, from .whl/)
      timeout ${BENCH_TIMEOUT:-400} python3 -m mixed_gemm.cli bench --compare --bits ${BENCH_BITS:-2,3,4,7} --group-size 64 \
        --ms ${BENCH_MS:-1,16} --plot /tmp/bits.png --out "$OUT/bench-bits.md" 2>&1 | tee "$OUT/bench-bits.log" | tail -12 ;;
    moe90-tests)  # issue #24: the grouped wgmma family (every catalog tile, weight kinds, routing edge cases, graphs)
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -x tests/ops/test_moe_sm90a_gpu.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/pytest-moe90.log" | grep -vE "^[.sxFE]+ *\[" | tail -30 ;;
    profile-moe)  # issue #24: the grouped kernels' schedules per MoE preset, T and projection, into a copy of the profile
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      timeout ${PROFILE_TIMEOUT:-300} python3 -m mixed_gemm.cli profile-moe --tokens ${MOE_TOKENS:-1,2,4,8,16,32,64,256} \
        --out "$OUT/h100.json" 2>&1 | tee "$OUT/profile-moe.log" | grep -vE "Warning|warn\(" | tail -50
      MIXED_GEMM_PROFILE=$OUT/h100.json timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -m gpu tests/ops/test_moe_gemv_gpu.py \
        tests/ops/test_experts.py tests/nn/test_moe.py -p no:cacheprovider 2>&1 | tail -2 ;;
    profile-lowbit-all)  # issue #26 item 3: 2/3-bit and 1:2-sparse at M 1..32, fp16 then bf16, in one deadline
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      [ -f profiles/h100.partial.jsonl ] && cp profiles/h100.partial.jsonl "$OUT/"
      end=$(( $(date +%s) + ${PROFILE_DEADLINE:-500} ))
      for d in f16 bf16; do for b in 2 3 7; do
        left=$(( end - $(date +%s) )); [ $left -gt 20 ] || break 2
        echo "== $d $b-bit ($left s left)"
        timeout $left python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --bits $b --group-size 64 --dtype $d \
          --ms ${PROFILE_MS:-1,2,4,8,16,32} --out "$OUT/h100.json" --quiet 2>&1 | tail -1
      done; done ;;
    profile-lowbit)  # the low-bit widths (group 64, the #15 targets' kind) at decode M and one dequant_mm M
      [ -f "$OUT/h100.json" ] || cp profiles/h100.json "$OUT/h100.json"
      for b in ${PROFILE_BITS:-2 3 7}; do
        timeout ${PROFILE_TIMEOUT:-150} python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --bits $b --group-size 64 \
          --ms ${PROFILE_MS:-1,2,4,8,16,32,128} --out "$OUT/h100.json" --quiet 2>&1 | tail -1
      done ;;
    lowbit-tests) timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -x tests/ops/test_lowbit_gpu.py tests/ops/test_gemv_gpu.py \
                    2>&1 | tee "$OUT/pytest-lowbit.log" | tail -15 ;;
    bench-cli) python3 -m mixed_gemm.cli bench --compare --dtype ${BENCH_DTYPE:-f16} --plot "$OUT/bench.png" --out "$OUT/bench.md" \
                 --json "$OUT/bench.json" 2>&1 | tail -30 ;;
    sanitize)
      for tool in memcheck racecheck; do
        echo "== compute-sanitizer --tool $tool"
        # --report-api-errors no: torch and cuda-python probe optional driver entry points
        # (cuGetProcAddress), which memcheck would otherwise count; device memory errors still count.
        compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 bench/sanitize_subset.py 2>&1 \
          | tee "$OUT/sanitize-$tool.log" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rel err|FAIL|Error" | tail -12
        echo "exit: ${PIPESTATUS[0]}"
      done ;;
    ncu)  # hardware counters of each case in bench/ncu_cases.txt (one ncu_case.py argument line each)
      i=0
      while read -r line; do
        [ -z "$line" ] || [ "${line#\#}" != "$line" ] && continue
        i=$((i + 1)); echo "== case $i: $line"
        timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --kernel-name regex:mg_ --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
          --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats \
          --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
          python3 bench/ncu_case.py $line > "$OUT/ncu-$i.txt" 2>&1
        grep -E "median|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Ipc|No Eligible|Active Warps Per|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |Block Limit|Dynamic Shared|Waves Per SM|Shared Memory Configuration" "$OUT/ncu-$i.txt" | sed 's/  */ /g'
        grep -E "issue_stalled" "$OUT/ncu-$i.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/  */ /g' \
          | awk '$NF > 0.1 {printf "%s=%s ", $1, $NF} END {print ""}'
      done < ${NCU_CASES:-bench/ncu_cases.txt} ;;
    sass)
      for f in "$MIXED_GEMM_CACHE_DIR"/*/*.fatbin; do
        echo "== $(basename "$f")"
        cuobjdump -sass -arch sm_90 "$f" | grep -oE "^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9_.]+" | awk '{print $2}' \
          | sed 's/\..*//' | sort | uniq -c | sort -rn | grep -E "HMMA|LDSM|LOP3|PRMT|I2F|F2F|LDGSTS|HFMA2|HMUL2|HADD2|LDL|STL" | tr '\n' ' '
        echo
      done 2>&1 | tee "$OUT/sass.txt" ;;
  esac
done
