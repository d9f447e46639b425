# Sourced by the session 23 device scripts: the carried wheels installed once per machine, and each
# carried kernel-cache archive (kcache/*.txz, the sm90a parts) unpacked into /tmp/kcache once: a
# warm machine takes the archives in several calls (the device tool's 64 MiB carry limit).
export PYTHONUNBUFFERED=1
T=/tmp/site
if [ ! -d $T/cutlass_library ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target $T .whl/*.whl; fi
export PYTHONPATH=$PWD:$T MIXED_GEMM_CACHE_DIR=/tmp/kcache
mkdir -p /tmp/kcache
for f in kcache/*.txz; do
  [ -f "$f" ] || continue
  mark=/tmp/kcache/.unpacked-$(basename "$f")-$(stat -c %s "$f")
  [ -f "$mark" ] || { xz -dc "$f" | tar xf - -C /tmp/kcache && touch "$mark"; }
done
if ls kcache/kcache90.txz.part-* >/dev/null 2>&1; then
  mark=/tmp/kcache/.unpacked-kcache90-$(cat kcache/kcache90.txz.part-* | wc -c)
  [ -f "$mark" ] || { cat kcache/kcache90.txz.part-* | xz -dc | tar xf - -C /tmp/kcache && touch "$mark"; }
fi
echo "env: $(ls /tmp/kcache | grep -vc lock) cache entries; wheels in $T: $(ls $T | wc -l)"
