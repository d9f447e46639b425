"""Timing on the GPU the way the benchmarks are reported: CUDA-graph replay, CUDA events, median.

Cold L2: the caller rotates over enough copies of the weight that together they exceed twice the
L2 (:func:`copies_for`), so every timed call streams its weight from HBM as in a real model,
where each layer's weight is read once per step.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional


def gpu_missing() -> Optional[str]:
    """Why the GPU tools cannot run here, or None."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU"
    return None


def copies_for(nbytes: int, l2_bytes: int) -> int:
    """Copies of an ``nbytes`` operand that together exceed twice the L2 (at least 2)."""
    return max(2, math.ceil(2 * l2_bytes / max(nbytes, 1)) + 1)


def time_graph(fn: Callable[[int], object], calls: int, replays: int = 7) -> float:
    """Median seconds per call of ``fn(i)``, i = 0..calls-1, captured once into a CUDA graph."""
    import torch

    fn(0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's graph docs require
        for i in range(min(calls, 2)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(samples)


def calls_for(fn: Callable[[int], object], copies: int, target_s: float = 2e-3, cap: int = 64) -> int:
    """Calls per graph: every copy at least once, and about ``target_s`` of work per replay."""
    import torch

    fn(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(1 % copies)
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    return max(copies, min(cap, math.ceil(target_s / max(once, 1e-6))))


def copy_bandwidth() -> float:
    """Device-to-device copy rate in bytes/s (bytes read plus written) of a 1 GiB copy in a graph."""
    import torch

    a = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    t = time_graph(lambda i: b.copy_(a), calls=5)
    del a, b
    return 2 * (1 << 30) / t


def host_overhead(fn: Callable[[], object], calls: int = 200, repeats: int = 7) -> float:
    """Host (CPU) seconds per eager call of ``fn``: median over ``repeats`` bursts of ``calls``
    launches, timed without waiting for the GPU. A burst stays well under the launch queue's
    depth and the GPU is idle when it starts, so the GPU's own time does not leak in."""
    import torch

    for _ in range(20):
        fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return statistics.median(samples)
