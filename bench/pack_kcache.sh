#!/usr/bin/env bash
# Pack the kernel cache entries of every catalog kernel (built for the current sources) into kcache/:
# rest.txz (every fatbin) and kcache90.txz.part-* (sm90a libraries, mostly the same static cudart:
# xz over the tar dedupes them), each under the device tool's 16 MB file limit. Entries of stale
# sources are left out. Usage: MIXED_GEMM_CACHE_DIR=/path/to/cache bash bench/pack_kcache.sh
set -euo pipefail
cache=${MIXED_GEMM_CACHE_DIR:?set MIXED_GEMM_CACHE_DIR}
py=${PYTHON:-.venv/bin/python}
$py -m mixed_gemm.cli build --all --filter mg_ --jobs 2 | awk 'NF == 2 {print $2}' | xargs -n1 dirname | xargs -n1 basename \
  | sort -u > /tmp/kcache.entries
rm -f kcache/kcache.tgz.part-* kcache/kcache90.txz.part-* kcache/rest.txz
(cd "$cache" && grep -v '^mg_sm90a_' /tmp/kcache.entries | tar cf - --exclude='*.lock' -T -) | xz -9 -T0 > kcache/rest.txz
(cd "$cache" && grep '^mg_sm90a_' /tmp/kcache.entries | tar cf - --exclude='*.lock' -T -) | xz -9 -T0 \
  | split -b 15M - kcache/kcache90.txz.part-
echo "$(wc -l < /tmp/kcache.entries) entries"; ls -la kcache
