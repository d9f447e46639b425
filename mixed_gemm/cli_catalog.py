"""``mixed-gemm build`` (precompile the catalog into the kernel cache) and ``mixed-gemm generate``
(re-render ``generated/`` from the templates)."""
from __future__ import annotations

import argparse
from pathlib import Path


def _configs(args):
    from .codegen.catalog import default_catalog, dequant_catalog

    configs = default_catalog() + dequant_catalog()
    if args.filter:
        configs = [c for c in configs if args.filter in c.kernel_name]
    return configs


def run_build(args: argparse.Namespace) -> int:
    from .build import build_many
    from .codegen import render

    configs = _configs(args)
    paths = build_many([(c.kernel_name, render(c)) for c in configs], jobs=args.jobs, progress=not args.quiet)
    for c, p in zip(configs, paths):
        if not args.quiet:
            print(f"{c.kernel_name}  {p}")
    print(f"{len(paths)} kernels in the cache")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from .codegen.catalog import write_generated

    written = write_generated(Path(args.dir))
    print(f"{len(written)} file(s) rewritten in {args.dir}")
    return 0


def add_build_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build", help="compile the default kernel catalog into the cache")
    p.add_argument("--filter", default="", help="only configs whose name contains this text")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-kernel lines")
    p.set_defaults(func=run_build)
    return p


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="re-render generated/ from templates/ (writes only changes)")
    p.add_argument("--dir", default="generated", help="output directory (default: ./generated)")
    p.set_defaults(func=run_generate)
    return p
