"""Timing on the GPU the way the benchmarks are reported: CUDA-graph replay, CUDA events, median.

Cold L2: the caller rotates over enough copies of the weight that together they exceed twice the
L2 (:func:`copies_for`), so every timed call streams its weight from HBM as in a real model,
where each layer's weight is read once per step.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict, List, Optional


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


def graph_of(fn: Callable[[], object], reps: int, why: Optional[List[str]] = None):
    """``reps`` calls of ``fn`` captured in one CUDA graph, or None where it cannot be (mg.moe's
    per-expert path reads the routing on the host; the dense loop too); ``why`` gets the reason."""
    import torch

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return graph
    except (RuntimeError, ValueError, AssertionError) as exc:  # a peer checks with assert
        torch.cuda.synchronize()
        if why is not None:
            why.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        return None


def _elapsed_s(run: Callable[[], object]) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


FLUSHES = ("write", "read")  # how time_cold empties the L2 before each call


def l2_flush_buffer():
    """An fp32 buffer twice the current GPU's L2: writing (or reading) all of it evicts what a
    timed call would otherwise find in L2."""
    import torch

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return torch.empty(2 * l2 // 4 + 1, dtype=torch.float32, device="cuda")


def time_cold(fns: Dict[str, Callable[[], object]], rounds: int, calls: int = 10,
              eager: bool = True, uncaptured: Optional[Dict[str, str]] = None,
              flush: str = "write") -> Dict[str, tuple]:
    """``(seconds, how)`` per fn: one call on a cold L2, the median over ``rounds`` of ``calls``
    calls each preceded by a write of a buffer twice the L2, less the same number of writes alone
    (so neither the graph launch nor the event timing is counted in a call). Replayed from a
    CUDA graph where the fn can be captured, else eager (``how`` says which; a capturable fn is
    timed both ways and keeps the faster: mg.moe under capture always takes its grouped kernels,
    eager it may take its per-expert path; ``eager=False``: a capturable fn is timed from its graph
    only, the A/B of kernels where host time must not count). Eager, the flushes run while the host
    issues the next call, which hides up to a flush's time of host work: in the dense paths' favour.
    Each fn is called once eagerly before its capture (kernels built, plans and workspaces sized);
    ``uncaptured`` gets, per fn that could not be captured, why. Fns alternate. The MoE bench's and
    profile-moe's layer timing (their figures compare). ``flush``: ``"write"`` zeroes the buffer
    (the published figures; it leaves the L2 full of dirty lines, written back while the call
    reads), ``"read"`` sums it into one float (a clean L2: the A/B that tells the two apart)."""
    import torch

    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {FLUSHES}, got {flush!r}")
    buf = l2_flush_buffer()
    buf.zero_()
    total = torch.empty((), dtype=torch.float32, device="cuda")
    empty_l2 = buf.zero_ if flush == "write" else (lambda: torch.sum(buf, dim=0, out=total))

    def flushed(fn):
        def call():
            empty_l2()
            fn()
        return call

    def eager_calls(fn):
        return lambda: [fn() for _ in range(calls)]

    runs: Dict[tuple, Callable[[], object]] = {("flush", "eager"): eager_calls(empty_l2)}
    flush_graph = graph_of(empty_l2, calls)
    runs[("flush", "graph")] = flush_graph.replay
    for name, fn in fns.items():
        fn()
        why: List[str] = []
        graph = graph_of(flushed(fn), calls, why)
        if why and uncaptured is not None:
            uncaptured[name] = why[0]
        if graph is not None:
            runs[(name, "graph")] = graph.replay
        if graph is None or eager:
            runs[(name, "eager")] = eager_calls(flushed(fn))
    samples: Dict[tuple, List[float]] = {key: [] for key in runs}
    for rep in range(rounds):
        for key, run in (list(runs.items()) if rep % 2 == 0 else list(reversed(runs.items()))):
            samples[key].append(_elapsed_s(run))
    base = {how: statistics.median(samples[("flush", how)]) for how in ("eager", "graph")}
    out: Dict[str, tuple] = {}
    for (name, how), times in samples.items():
        if name == "flush":
            continue
        t = max(statistics.median(times) - base[how], 0.0) / calls
        if name not in out or t < out[name][0]:
            out[name] = (t, how)
    return out
