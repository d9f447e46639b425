#!/usr/bin/env bash
# Session 21, call 1 (issue #26): whole 3-bit fields. Builds this tree's 3-bit kernels and the
# previous tree's (.ab_old, carried), runs the 3-bit GPU tests, then an old/new A/B of the 3-bit
# schedules (alternating processes, each with fp16 beside it), then a 3-bit fp16 sweep at M 1, 16.
set -uo pipefail
export PYTHONUNBUFFERED=1
T=/tmp/site
[ -d $T/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $T .whl/*.whl
export PYTHONPATH=$PWD:$T MIXED_GEMM_CACHE_DIR=/tmp/kcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
old() { (cd .ab_old && PYTHONPATH=$PWD:$T MIXED_GEMM_CACHE_DIR=/tmp/kcache_old "$@"); }
s=$SECONDS
(python3 -m mixed_gemm.cli build --all --filter _u3_ --jobs 12 --quiet > $OUT/build_new.log 2>&1; echo "new rc $?" >> $OUT/build_new.log) &
old python3 -m mixed_gemm.cli build --all --filter mg_gemv_f16_u3 --jobs 4 --quiet > $OUT/build_old.log 2>&1
wait
echo "builds: $((SECONDS - s)) s"; tail -qn1 $OUT/build_new.log $OUT/build_old.log
timeout 150 python3 -m pytest -q -p no:cacheprovider $(cat bench/session21_u3_tests.txt) 2>&1 | tee $OUT/u3_tests.log | tail -3
for r in 1 2; do
  old timeout 150 python3 bench/ring_ab.py --cases ../bench/session21_u3_cases.txt --rounds 3 --out $OUT/ab_old_$r.txt > $OUT/ab_old_$r.log 2>&1
  timeout 150 python3 bench/ring_ab.py --cases bench/session21_u3_cases.txt --rounds 3 --out $OUT/ab_new_$r.txt > $OUT/ab_new_$r.log 2>&1
done
echo "== old | new (us, speedup over fp16), two alternating rounds"
for r in 1 2; do paste -d'|' <(cut -c1-80 $OUT/ab_old_$r.txt) <(awk '{print $(NF-6), $(NF-5), $(NF-4)}' $OUT/ab_new_$r.txt); done
tail -3 $OUT/ab_new_1.log
if [ "${SWEEP:-1}" = 1 ]; then
  cp profiles/h100.json $OUT/h100.json
  timeout ${SWEEP_TIMEOUT:-200} python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --bits 3 --group-size 64 \
    --ms 1,16 --dtype f16 --out $OUT/h100.json --quiet > $OUT/sweep.log 2>&1; echo "sweep rc $?"
  python3 - "$OUT/h100.json" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1]))["entries"]:
    if e["bits"] == 3 and e["dtype"] == "f16" and e["m"] in (1, 16):
        print(e["n"], e["k"], e["m"], e["schedule"], e["us"])
PY
fi
