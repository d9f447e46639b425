# Prepares a GPU machine from what a call carried, once per machine; sourced from the repository
# root, by bench/device/run.sh or by a command of your own:
#
#   source bench/device/env.sh && python3 -m mixed_gemm.cli bench --shapes 4096:4096 --ms 1,16
#
# What it reads (all optional; see bench/device/README.md for how to make them):
#   .whl/*.whl   wheels the machine lacks (nvidia-cutlass for the CUTLASS headers, gemlite, ...),
#                installed without an index into /tmp/site and put on PYTHONPATH
#   kcache/      kernel-cache archives: *.txz, kcache90.txz.part-* (sm90a libraries) and
#                kcache.tgz.part-* (fatbins), each unpacked once into $MIXED_GEMM_CACHE_DIR
#                (default /tmp/kcache, which outlives a call on a warm machine, so archives may
#                arrive over several calls); entries built by the same nvcc and CUTLASS verify and load
#   .kpkg/*.whl  a kernel package (`mixed-gemm build --package`), installed into /tmp/kpkg but not
#                put on PYTHONPATH: `with_pkg CMD ...` runs CMD with it and MIXED_GEMM_JIT=off, the
#                way the published tables were measured
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SITE=/tmp/site
if [ ! -d $SITE/cutlass_library ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl || echo "env: wheel install failed" >&2
fi
export PYTHONPATH=$PWD:$SITE
export MIXED_GEMM_CACHE_DIR=${MIXED_GEMM_CACHE_DIR:-/tmp/kcache}
mkdir -p "$MIXED_GEMM_CACHE_DIR"

# One marker per archive (name and size), so a changed archive of the same name unpacks again.
_unpack() {  # _unpack MARK DECOMPRESSOR FILE...
  local mark=$MIXED_GEMM_CACHE_DIR/.unpacked-$1 dec=$2
  shift 2
  [ -f "$mark" ] && return 0
  cat "$@" | $dec | tar xf - -C "$MIXED_GEMM_CACHE_DIR" && touch "$mark"
}
for f in kcache/*.txz; do
  [ -f "$f" ] && _unpack "$(basename "$f")-$(stat -c %s "$f")" "xz -dc" "$f"
done
if ls kcache/kcache90.txz.part-* >/dev/null 2>&1; then
  _unpack "kcache90-$(cat kcache/kcache90.txz.part-* | wc -c)" "xz -dc" kcache/kcache90.txz.part-*
fi
if ls kcache/kcache.tgz.part-* >/dev/null 2>&1; then
  _unpack "kcache-tgz-$(cat kcache/kcache.tgz.part-* | wc -c)" "gzip -dc" kcache/kcache.tgz.part-*
fi

KPKG=/tmp/kpkg
if ls .kpkg/*.whl >/dev/null 2>&1; then
  MIXED_GEMM_KERNEL_WHEEL=$(ls "$PWD"/.kpkg/*.whl | head -1)
  export MIXED_GEMM_KERNEL_WHEEL  # tests/ops/test_packaged_gpu.py installs it itself
  ls -d $KPKG/mixed_gemm_kernels_* >/dev/null 2>&1 \
    || python3 -m pip install -q --no-index --no-deps --no-compile --target $KPKG .kpkg/*.whl
fi

# with_pkg CMD...: CMD with the kernel package importable and compiling forbidden; without a
# package, CMD as it is (kernels then come from the cache, or compile).
with_pkg() {
  if [ -d $KPKG ]; then PYTHONPATH=$PYTHONPATH:$KPKG MIXED_GEMM_JIT=off "$@"; else "$@"; fi
}

echo "env: $(ls "$MIXED_GEMM_CACHE_DIR" | grep -vc lock) cache entries, $(ls $SITE 2>/dev/null | wc -l) entries in $SITE," \
  "kernel package: $([ -d $KPKG ] && echo installed || echo none)"
