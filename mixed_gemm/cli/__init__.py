"""The ``mixed-gemm`` command line (also ``python -m mixed_gemm.cli``).

Subcommands are registered in ``_COMMANDS`` as ``name -> "module:function"``. The function is
called as ``function(subparsers)``; it adds its parser with ``subparsers.add_parser(name, ...)`` and
sets ``func=handler`` via ``set_defaults``, where ``handler(args) -> int`` returns the exit code.
Keep heavy imports inside handlers: every registered module is imported to build ``--help``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from ..compile.errors import BuildError
from ..version import __version__

_COMMANDS: dict[str, str] = {
    "info": f"{__name__}.info:add_info_parser",
    "build": f"{__name__}.build:add_build_parser",
    "generate": f"{__name__}.build:add_generate_parser",
    "profile": f"{__name__}.profile:add_profile_parser",
    "profile-moe": f"{__name__}.profile:add_profile_moe_parser",
    "bench": f"{__name__}.bench:add_bench_parser",
    "e2e": f"{__name__}.e2e:add_e2e_parser",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mixed-gemm", description="CUTLASS mixed-input GEMM kernels: build, inspect, profile."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for spec in _COMMANDS.values():
        module_name, _, func_name = spec.partition(":")
        getattr(importlib.import_module(module_name), func_name)(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mixed-gemm`` script; returns the exit code."""
    args = build_parser().parse_args(argv)
    from ..compile import blocking

    try:
        # Commands that build, profile or time kernels want the kernel selection picked, compiled
        # on the spot if need be, never a stand-in (MIXED_GEMM_JIT=off still forbids compiling).
        with blocking():
            return int(args.func(args) or 0)
    except BuildError as exc:
        print(f"mixed-gemm {args.command}: error: {exc}", file=sys.stderr)
        return 1
