"""Compiling kernels in the background, so a cold ``matmul`` never waits for nvcc.

Each build is an nvcc process started from a daemon thread (the Python side only waits on it),
at most ``$MIXED_GEMM_JIT_WORKERS`` at a time (default: a quarter of the CPUs, 1 to 4: an sm90a
library takes up to 7 GB of compiler memory), niced so that the host loop it would slow (eager
decode is bound by its Python thread) keeps its core. A build lands in the kernel cache like any other --
meta.json last, with the binary's sha256 -- and the caller loads it through
:func:`~.cache.build_spec`, which verifies it, so nothing unverified is ever launched. One request
per kernel name; a finished or failed one is remembered.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from typing import Dict, List, Optional

from .cache import BuildSpec, build_spec
from .nvcc import run_in_background

log = logging.getLogger(__name__)

WORKERS_ENV = "MIXED_GEMM_JIT_WORKERS"

_JOBS: Dict[str, Future] = {}
_LOCK = threading.Lock()
_SLOTS: Optional[threading.BoundedSemaphore] = None


def workers() -> int:
    raw = os.environ.get(WORKERS_ENV)
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV}={raw!r}: must be a positive integer") from None
        if n < 1:
            raise ValueError(f"{WORKERS_ENV}={raw!r}: must be a positive integer")
        return n
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def _run(spec: BuildSpec, future: Future) -> None:
    with _SLOTS:
        run_in_background(True)
        try:
            path = build_spec(spec)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            log.warning("background build of %s failed: %s", spec.name, exc)
            future.set_exception(exc)
        else:
            log.info("background build of %s done: %s", spec.name, path)
            future.set_result(path)


def submit(spec: BuildSpec) -> Future:
    """A future of ``spec``'s binary path, building it in the background (once per name)."""
    global _SLOTS
    with _LOCK:
        future = _JOBS.get(spec.name)
        if future is not None:
            return future
        if _SLOTS is None:
            _SLOTS = threading.BoundedSemaphore(workers())
        future = _JOBS[spec.name] = Future()
        future.set_running_or_notify_cancel()
    threading.Thread(target=_run, args=(spec, future), name=f"mixed-gemm-build-{spec.name}", daemon=True).start()
    log.info("compiling %s in the background", spec.name)
    return future


def pending() -> List[str]:
    """Names of the kernels still compiling in the background."""
    with _LOCK:
        return sorted(name for name, f in _JOBS.items() if not f.done())


def wait(timeout: Optional[float] = None) -> List[str]:
    """Wait until every background build has finished (or ``timeout`` seconds); the names of
    those that failed. Servers call this (through ``mixed_gemm.wait_for_builds``) after warm-up
    and before capturing CUDA graphs, so the graphs hold the chosen kernels, not stand-ins."""
    import concurrent.futures as cf

    with _LOCK:
        jobs = dict(_JOBS)
    done, _ = cf.wait(list(jobs.values()), timeout=timeout)
    return sorted(name for name, f in jobs.items() if f in done and f.exception() is not None)
