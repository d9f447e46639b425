#!/usr/bin/env bash
# Packs the kernel-cache entries of every catalog kernel, as built for the current sources, into
# kcache/ for the GPU machine (bench/device/env.sh unpacks them there): rest.txz (every fatbin) and
# kcache90.txz.part-* (the sm90a libraries, mostly the same static cudart, which xz over one tar
# dedupes), in parts under the 16 MB a device call may carry per file. Entries of stale sources are
# left out; kernels not yet built are built first (nvcc here, no GPU needed).
#
#   MIXED_GEMM_CACHE_DIR=/path/to/cache [PYTHON=python3] bash bench/device/pack_kcache.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${MIXED_GEMM_CACHE_DIR:?set MIXED_GEMM_CACHE_DIR}
py=${PYTHON:-python3}
mkdir -p kcache
$py -m mixed_gemm.cli build --all --filter mg_ --jobs 2 | awk 'NF == 2 {print $2}' | xargs -n1 dirname | xargs -n1 basename \
  | sort -u > /tmp/kcache.entries
rm -f kcache/kcache.tgz.part-* kcache/kcache90.txz.part-* kcache/rest.txz
(cd "$cache" && grep -v '^mg_sm90a_' /tmp/kcache.entries | tar cf - --exclude='*.lock' -T -) | xz -9 -T0 > kcache/rest.txz
(cd "$cache" && grep '^mg_sm90a_' /tmp/kcache.entries | tar cf - --exclude='*.lock' -T -) | xz -9 -T0 \
  | split -b 15M - kcache/kcache90.txz.part-
echo "$(wc -l < /tmp/kcache.entries) entries"; ls -la kcache
