#!/usr/bin/env bash
# Pack the kernel cache entries of every catalog kernel (built for the current sources) into kcache/:
# kcache.tgz.part-* (fatbins, under the device tool's 16 MB file limit) and kcache90.txz (sm90a
# libraries). Usage: MIXED_GEMM_CACHE_DIR=/path/to/cache bash bench/pack_kcache.sh
set -euo pipefail
cache=${MIXED_GEMM_CACHE_DIR:?set MIXED_GEMM_CACHE_DIR}
py=${PYTHON:-.venv/bin/python}
$py -m mixed_gemm.cli build --all --filter mg_ --jobs 2 | awk 'NF == 2 {print $2}' | xargs -n1 dirname | xargs -n1 basename \
  | sort -u > /tmp/kcache.entries
rm -f kcache/kcache.tgz.part-* kcache/kcache90.txz
(cd "$cache" && grep -v '^mg_sm90a_' /tmp/kcache.entries | tar czf - --exclude='*.lock' -T -) | split -b 15M - kcache/kcache.tgz.part-
(cd "$cache" && grep '^mg_sm90a_' /tmp/kcache.entries | tar cf - --exclude='*.lock' -T -) | xz -9 -T0 > kcache/kcache90.txz
echo "$(wc -l < /tmp/kcache.entries) entries"; ls -la kcache
