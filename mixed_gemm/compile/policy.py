"""When a kernel that is neither packaged nor cached may be compiled: ``$MIXED_GEMM_JIT``.

- ``async`` (default): ``matmul`` never waits for nvcc. It runs a kernel that is available now
  (packaged or cached) and compiles the one selection chose in the background; later calls switch
  to it (:mod:`mixed_gemm.select.selection`). Explicit configs, overrides, the profiler, ``build``
  and the benchmarks compile on the calling thread, as in ``block``.
- ``block`` (also ``1``, ``on``): compile on the calling thread when needed (tests use this).
- ``off`` (also ``0``, ``no``): never compile; a kernel missing from the packages and the cache
  raises :class:`JitDisabledError`, naming it and how to get it.
"""
from __future__ import annotations

import contextlib
import os
import threading

from .errors import BuildError

JIT_ENV = "MIXED_GEMM_JIT"
_ALIASES = {"": "async", "async": "async", "auto": "async", "background": "async",
            "block": "block", "blocking": "block", "sync": "block", "1": "block", "on": "block", "yes": "block",
            "true": "block", "off": "off", "0": "off", "no": "off", "false": "off", "never": "off"}
_local = threading.local()


class JitDisabledError(BuildError):
    """A kernel had to be compiled but ``MIXED_GEMM_JIT=off`` forbids it."""


def jit_mode() -> str:
    """``"async"``, ``"block"`` or ``"off"``: ``$MIXED_GEMM_JIT`` (``off`` always wins), else a
    :func:`blocking` block on this thread, else ``async``."""
    raw = os.environ.get(JIT_ENV, "").strip().lower()
    if raw not in _ALIASES:
        raise ValueError(f"{JIT_ENV}={raw!r}: must be one of async, block, off (or 1/0)")
    mode = _ALIASES[raw]
    if mode == "async" and getattr(_local, "blocking", 0):
        return "block"
    return mode


@contextlib.contextmanager
def blocking():
    """Inside this block (on this thread) selection compiles what it chose before running it,
    unless ``$MIXED_GEMM_JIT=off``: for the profiler, the benchmarks and tests that must time or
    check the kernel selection picked, not a stand-in."""
    _local.blocking = getattr(_local, "blocking", 0) + 1
    try:
        yield
    finally:
        _local.blocking -= 1


def compile_refused(name: str, where: str, packages: list) -> JitDisabledError:
    """The error for a kernel that JIT-off forbids compiling."""
    found = "; ".join(packages) if packages else "none installed"
    return JitDisabledError(
        f"{name}: not in an installed kernel package ({found}) nor in the kernel cache {where}, and "
        f"{JIT_ENV}={os.environ.get(JIT_ENV)} forbids compiling it. Install the kernel package for this "
        f"GPU (pip install mixed-gemm-kernels-<arch>, or build one with `mixed-gemm build --package DIR "
        f"--arch <arch>`), put it in the cache (`{JIT_ENV}=block mixed-gemm build --filter {name}`), or "
        f"unset {JIT_ENV}.")
