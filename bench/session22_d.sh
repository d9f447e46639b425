#!/usr/bin/env bash
# Session 22: the low bits at M 256 and 512 (the sm80 _lowbit tiles against dequantize + cuBLAS), so
# that exact entries, not the 128-token ones borrowed two octaves up, decide there; then the low-bit
# GPU tests. Carry .whl and kcache/rest.txz (sm80 and dequant_mm fatbins; no gemv above 32 tokens).
set -uo pipefail
source bench/s22_env.sh
s=$SECONDS
cp profiles/h100.json $OUT/h100.json
for dt in f16 bf16; do for b in 2 3 7; do
  timeout 60 python3 -m mixed_gemm.cli profile --model llama3-8b,llama3-70b --bits $b --group-size 64 --ms 256,512 \
    --dtype $dt --out $OUT/h100.json --quiet >> $OUT/sweep.log 2>&1; echo "u$b $dt rc $? $((SECONDS - s)) s"
done; done
python3 - $OUT/h100.json <<'PY'
import json, sys, collections
c = collections.Counter((e["bits"], e["m"], e["schedule"].split(":")[0]) for e in json.load(open(sys.argv[1]))["entries"]
                        if e["bits"] in (2, 3, 7) and e["m"] >= 64)
for k, v in sorted(c.items()): print(*k, v)
PY
MIXED_GEMM_PROFILE=$OUT/h100.json timeout 240 python3 -m pytest -q -p no:cacheprovider tests/ops/test_lowbit_gpu.py -k every_m 2>&1 | tail -2
