#!/usr/bin/env bash
# Session 22, call 1 (issue #26 item 2): the sm80 tiles on the lowbit layout (`_lowbit`). Carry .whl
# and kcache/ (s22.txz: the low-bit and fp16 int4 gemv kernels, every sm80 and dequant_mm fatbin;
# the sm90a part). Runs the low-bit GPU tests, then profiles 2-, 3-bit and 1:2-sparse g64 at M 16
# and 32 (fp16, bf16; every family's candidates) into a copy of the shipped profile
# ($OUT/h100.json, also left in /tmp for call 2) and prints what changed at those M.
set -uo pipefail
source bench/s22_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
python3 -m mixed_gemm.cli build --all --filter _lowbit --jobs 16 --quiet 2>&1 | tail -1
for f in mg_gemv_f16_u2 mg_gemv_f16_u3 mg_gemv_f16_u7 mg_gemv_bf16_u2 mg_gemv_bf16_u3 mg_gemv_bf16_u7 mg_dequant; do
  python3 -m mixed_gemm.cli build --all --filter $f --jobs 16 --quiet 2>&1 | tail -1; done
echo "build $((SECONDS - s)) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/ops/test_lowbit_gpu.py -k "sm80 or every_m" 2>&1 | tee $OUT/tests.log | tail -3
grep -E "^(FAILED|ERROR)" $OUT/tests.log | head
echo "tests $((SECONDS - s)) s"
cp profiles/h100.json $OUT/h100.json
for dt in f16 bf16; do for b in 2 3 7; do
  [ $((SECONDS - s)) -gt 540 ] && break 2
  timeout 110 python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --bits $b --group-size 64 --ms 16,32 \
    --dtype $dt --out $OUT/h100.json --quiet >> $OUT/sweeps.log 2>&1; echo "u$b $dt rc $? $((SECONDS - s)) s"
done; done
cp $OUT/h100.json /tmp/s22_h100.json
python3 - profiles/h100.json $OUT/h100.json <<'PY'
import json, sys
old = {(e["dtype"], e["bits"], e["n"], e["k"], e["m"]): e for e in json.load(open(sys.argv[1]))["entries"] if e["group_size"] == 64}
print("dtype bits n k m | old schedule us | new schedule us | change")
for e in json.load(open(sys.argv[2]))["entries"]:
    key = (e["dtype"], e["bits"], e["n"], e["k"], e["m"])
    if e["group_size"] == 64 and e["bits"] in (2, 3, 7) and e["m"] in (16, 32) and key in old:
        o = old[key]
        print(*key, "|", o["schedule"], o["us"], "|", e["schedule"], e["us"], "|", f"{e['us'] / o['us'] - 1:+.0%}")
PY
