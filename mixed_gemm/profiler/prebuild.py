"""Compile a sweep's candidate kernels before timing them, several nvcc at once.

Without this step a sweep compiles each candidate on first use, one after another; a CUTLASS
kernel library takes about a minute of nvcc. On a fresh H100 machine, one MoE preset's grouped
candidates at a single token count were still compiling when a 150 s limit ran out (2026-11-27).
:func:`build_candidates` hands them to :func:`mixed_gemm.compile.build_specs`. Kernels an
installed package or the cache already holds cost a lookup.

- With ``MIXED_GEMM_JIT=off`` nothing is compiled: the sweep times what exists, as before.
- A failed build stops only this step. The sweep then meets that candidate as it did without the
  step, and the candidates not built yet compile as they are timed.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

from ..compile import BuildError, blocking, build_specs, jit_mode


def build_candidates(specs: Iterable, jobs: Optional[int], log: Callable[[str], None]) -> int:
    """Build (or find) every :class:`~mixed_gemm.compile.BuildSpec` of ``specs``, ``jobs`` nvcc
    processes at a time (default: the CPU count); the number of distinct kernels ready, 0 when
    nothing was built (JIT off, no specs, or a failure, which is logged)."""
    specs = list(specs)
    if not specs or jit_mode() == "off":
        return 0
    start = time.perf_counter()
    try:
        with blocking():
            ready = len(build_specs(specs, jobs=jobs))
    except BuildError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        log(f"building the candidates stopped at a failure ({first}); the rest compile as they are timed")
        return 0
    log(f"{ready} candidate kernels ready ({time.perf_counter() - start:.0f} s)")
    return ready
