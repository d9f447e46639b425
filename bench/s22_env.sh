# Sourced by the session 22 device scripts: the carried wheels installed once per machine, the
# carried kernel cache (kcache/*.txz and the sm90a parts) unpacked once into /tmp/kcache.
export PYTHONUNBUFFERED=1
T=/tmp/site
[ -d $T/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $T .whl/*.whl
export PYTHONPATH=$PWD:$T MIXED_GEMM_CACHE_DIR=/tmp/kcache
mkdir -p /tmp/kcache
if [ ! -f /tmp/kcache/.s22 ]; then
  for f in kcache/*.txz; do [ -f "$f" ] && xz -dc "$f" | tar xf - -C /tmp/kcache; done
  if ls kcache/kcache90.txz.part-* >/dev/null 2>&1; then cat kcache/kcache90.txz.part-* | xz -dc | tar xf - -C /tmp/kcache; fi
  touch /tmp/kcache/.s22
fi
