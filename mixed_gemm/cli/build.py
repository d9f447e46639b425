"""``mixed-gemm build`` (precompile what selection can pick on the GPU, or with --all every catalog;
with --package, a kernel wheel for an arch) and ``mixed-gemm generate`` (re-render ``generated/``
from the templates)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ._args import fail, positive_int


def catalog(name_filter: str = "", families=None):
    """``(family, config)`` of every family's catalog (or of ``families``), in registry order: the dense
    families', then the grouped (MoE) families' (``kernels.ALL_FAMILIES``)."""
    from ..kernels import ALL_FAMILIES

    return [(fam, c) for fam in (ALL_FAMILIES if families is None else families) for c in fam.catalog()
            if name_filter in c.kernel_name]


def build_items(name_filter: str, all_families: bool):
    """``(family, config)`` that ``mixed-gemm build`` compiles. With a GPU: every kernel selection
    can pick there (its profile's schedules, each family's heuristic picks for every weight kind,
    the cold-call stand-ins: :func:`~mixed_gemm.select.coverage.selectable_on`, what a kernel
    package for it holds), so no call waits for nvcc; the profiler compiles its other candidates
    as it times them. Without a GPU (a cache built for deployment elsewhere), or with ``--all``:
    every family's whole catalog."""
    from ..kernels import base
    from ..select.coverage import selectable_on

    if all_families or base.compute_capability(0) is None:
        return catalog(name_filter)
    return [(f, c) for f, c in selectable_on(0) if name_filter in c.kernel_name]


def generated_sources():
    """``(kernel name, source)`` of the default catalogs: what ``generated/`` holds."""
    return [(c.kernel_name, fam.render(c)) for fam, c in catalog()]


def _build(items, args):
    """Build (or find) every ``(family, config)`` of ``items``; ``[(name, key, path)]``."""
    from ..compile import blocking, build_many
    from ..compile.cache import locate

    specs = [fam.build_spec(c) for fam, c in items]
    sources = [spec.source() for spec in specs]
    with blocking():
        paths = build_many([(spec.name, src, dict(arch_flags=spec.arch_flags, output=spec.output))
                            for spec, src in zip(specs, sources)], jobs=args.jobs, progress=not args.quiet)
    keys = [locate(spec.name, src, spec.arch_flags, output=spec.output)[0] for spec, src in zip(specs, sources)]
    return [(spec.name, key, path) for spec, key, path in zip(specs, keys, paths)]


def run_build(args: argparse.Namespace) -> int:
    if args.package is not None:
        return run_package(args)
    if args.arch is not None:
        return fail("build", "--arch goes with --package (the families to build otherwise follow the visible GPU, "
                             "or --all)")
    start = time.perf_counter()
    built = _build(build_items(args.filter, args.all), args)
    for name, _, p in built:
        if not args.quiet:
            print(f"{name}  {p}")
    print(f"{len(built)} kernels in the cache ({time.perf_counter() - start:.1f} s)")
    return 0


def run_package(args: argparse.Namespace) -> int:
    """Build the kernels ``matmul`` can select on ``--arch`` and write them as a wheel."""
    from collections import Counter

    from ..compile import BuildError, toolchain
    from ..compile.wheel import PackagedKernel, write_package
    from ..select.coverage import ARCHES, selectable

    if args.arch not in ARCHES:
        return fail("build", f"--arch: --package needs the GPU arch, one of {', '.join(ARCHES)}, got {args.arch!r}")
    tools, missing = toolchain()
    if tools is None:
        raise BuildError(f"a kernel package is built with nvcc and the CUTLASS headers: {missing}")
    start = time.perf_counter()
    items = [(fam, c) for fam, c in selectable(args.arch, grouped=True) if args.filter in c.kernel_name]
    built = _build(items, args)
    wheel = write_package(args.package, args.arch, [PackagedKernel(*b) for b in built], tools)
    families = ", ".join(f"{n} {name}" for name, n in Counter(fam.name for fam, _ in items).items())
    print(f"{wheel}: {len(built)} kernels ({families}), {wheel.stat().st_size / 2**20:.1f} MiB wheel, "
          f"{sum(p.stat().st_size for _, _, p in built) / 2**20:.1f} MiB of binaries in the cache, "
          f"{time.perf_counter() - start:.1f} s")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from ..codegen import write_generated

    written = write_generated(Path(args.dir), generated_sources())
    print(f"{len(written)} file(s) rewritten in {args.dir}")
    return 0


def add_build_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build", help="compile the kernels matmul can select on the visible GPU into the cache")
    p.add_argument("--filter", default="", help="only configs whose name contains this text")
    p.add_argument("--jobs", type=positive_int, default=None, help="parallel nvcc processes (default: CPU count)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-kernel lines")
    p.add_argument("--all", action="store_true",
                   help="every family's whole catalog (what the profiler times), also kernels the visible GPU "
                        "cannot run (default without a GPU); otherwise what matmul can select on the GPU")
    p.add_argument("--package", metavar="OUT_DIR", default=None,
                   help="instead of the catalog: build every kernel matmul can select on --arch (shipped "
                        "profiles, heuristics for every weight kind, fallbacks) and write them as an installable "
                        "wheel mixed-gemm-kernels-<arch> into OUT_DIR")
    p.add_argument("--arch", default=None, help="with --package: the GPU arch (sm90a: H100/H200; sm80: Ampere/Ada)")
    p.set_defaults(func=run_build)
    return p


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="re-render generated/ from templates/ (writes only changes)")
    p.add_argument("--dir", default="generated", help="output directory (default: ./generated)")
    p.set_defaults(func=run_generate)
    return p
