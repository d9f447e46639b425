"""Builds (where missing) and packs the kernel-cache entries of an A/B's schedules into one xz tar,
an extra cache part for the GPU machine (bench/device_run.sh unpacks every kcache/*.txz), so a
device run carries the few kernels it times instead of the whole cache.

    python bench/pack_cases.py bench/pf_cases.txt [--dtypes f16,bf16] [--out kcache/ab.txz]

A case line is ring_ab.py's: ``N K M BITS GROUP schedule [schedule ...]`` (``#`` comments).
"""
from __future__ import annotations

import argparse
import os
import subprocess

from mixed_gemm._paths import cache_dir
from mixed_gemm.compile.cache import build_spec, locate
from mixed_gemm.kernels import family_of, parse_schedule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("--dtypes", default="f16")
    ap.add_argument("--out", default="kcache/ab.txz")
    a = ap.parse_args()
    specs = {}
    for line in open(a.cases):
        fields = line.split("#")[0].split()
        for schedule in fields[5:]:
            for dtype in a.dtypes.split(","):
                config = parse_schedule(schedule, dtype=dtype, bits=int(fields[3]), zero_mode="int")
                spec = family_of(config).build_spec(config.kernel)
                specs[spec.name] = spec
    entries = []
    for spec in specs.values():
        build_spec(spec)
        entries.append(locate(spec.name, spec.source(), spec.arch_flags, (), spec.output)[1].name)
    out = os.path.abspath(a.out)
    subprocess.run(f"tar cf - {' '.join(sorted(entries))} | xz -T2 -6 > {out}", shell=True, check=True,  # noqa: S602
                   cwd=cache_dir())
    print(f"{len(entries)} kernels -> {a.out}")


if __name__ == "__main__":
    main()
