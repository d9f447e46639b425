"""Packs the kernel cache entries of the gemv ring kernels (``_p<stages>``) into kcache/ring.txz,
the GPU machine's extra cache part (bench/device_run.sh unpacks every kcache/*.txz)."""
import subprocess
import sys

from mixed_gemm.compile.cache import locate
from mixed_gemm._paths import cache_dir
from mixed_gemm.kernels.gemv import FAMILY

entries = set()
for c in FAMILY.catalog():
    if c.stages:
        spec = FAMILY.build_spec(c)
        _, entry, binary = locate(spec.name, spec.source(), spec.arch_flags, (), spec.output)
        if not binary.exists():
            sys.exit(f"{spec.name}: not built (mixed-gemm build --all --filter _p)")
        entries.add(entry.name)
out = sys.argv[1] if len(sys.argv) > 1 else "kcache/ring.txz"
subprocess.run(f"tar cf - {' '.join(sorted(entries))} | xz -T2 -6 > {out}", shell=True, check=True, cwd=cache_dir())  # noqa: S602 - our own names
print(f"{len(entries)} ring kernels -> {out}")
