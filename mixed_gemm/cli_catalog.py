"""``mixed-gemm build`` (precompile every family's catalog into the kernel cache) and
``mixed-gemm generate`` (re-render ``generated/`` from the templates)."""
from __future__ import annotations

import argparse
from pathlib import Path


def catalog(name_filter: str = "", families=None):
    """``(family, config)`` of every family's catalog (or of ``families``), in registry order."""
    from .kernels import FAMILIES

    return [(fam, c) for fam in (FAMILIES if families is None else families) for c in fam.catalog()
            if name_filter in c.kernel_name]


def build_families(all_families: bool):
    """The families ``mixed-gemm build`` compiles: those that run on a visible GPU (an sm90a kernel
    takes a minute of nvcc, wasted on a GPU it cannot run on); all of them without a GPU (a cache
    built for deployment elsewhere) or with ``--all``."""
    from .kernels import FAMILIES, available, base

    if all_families or base.compute_capability(0) is None:
        return FAMILIES
    return tuple(f for f, (ok, _) in available(0) if ok)


def generated_sources():
    """``(kernel name, source)`` of the default catalogs: what ``generated/`` holds."""
    return [(c.kernel_name, fam.render(c)) for fam, c in catalog()]


def run_build(args: argparse.Namespace) -> int:
    from .compile import build_many

    items = catalog(args.filter, build_families(args.all))
    specs = [fam.build_spec(c) for fam, c in items]
    paths = build_many([(name, source(), dict(arch_flags=arch, template_dirs=dirs, output=fam.output))
                        for (fam, _), (name, source, arch, dirs) in zip(items, specs)],
                       jobs=args.jobs, progress=not args.quiet)
    for (name, *_), p in zip(specs, paths):
        if not args.quiet:
            print(f"{name}  {p}")
    print(f"{len(paths)} kernels in the cache")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from .codegen import write_generated

    written = write_generated(Path(args.dir), generated_sources())
    print(f"{len(written)} file(s) rewritten in {args.dir}")
    return 0


def add_build_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build", help="compile every kernel family's default catalog into the cache")
    p.add_argument("--filter", default="", help="only configs whose name contains this text")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-kernel lines")
    p.add_argument("--all", action="store_true",
                   help="every family, also those the visible GPU cannot run (default without a GPU)")
    p.set_defaults(func=run_build)
    return p


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="re-render generated/ from templates/ (writes only changes)")
    p.add_argument("--dir", default="generated", help="output directory (default: ./generated)")
    p.set_defaults(func=run_generate)
    return p
