"""Host cost of one eager ``mg.matmul`` at M=1 against ``F.linear`` in the same process, and where
it goes: Python checks, output allocation, selection lookup, stream/device queries, the family
launcher's argument packing and the driver launch (``cuLaunchKernel`` through ctypes).

Each row is a burst of ``--calls`` back-to-back calls timed on the host (wall clock, no sync
inside: a burst stays under the launch queue's depth, so GPU back-pressure is not timed; see
docs/notes/measurement.md), bursts of every row alternating, median over ``--reps`` rounds.
The pieces are timed alone on the same objects; "checks and glue" is what the whole call costs
beyond its timed pieces. A loop-and-lambda baseline row tells what every row includes.

    python bench/host_cost.py [--n 256 --k 256] [--calls 200] [--reps 51] [--cprofile 5000]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import mixed_gemm as mg
from mixed_gemm.ops.matmul import _current_device
from mixed_gemm.profiler.workload import random_weights
from mixed_gemm.runtime import current_stream
from mixed_gemm.select.selection import SELECTED


def burst_us(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--calls", type=int, default=200, help="calls per burst (stay under the launch queue's depth)")
    ap.add_argument("--reps", type=int, default=51, help="alternating rounds (median)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="CALLS", help="also cProfile this many mg.matmul calls")
    args = ap.parse_args()

    torch.manual_seed(0)
    (w,) = random_weights(args.n, args.k)
    x = torch.randn(1, args.k, device="cuda", dtype=torch.float16)
    dense = torch.randn(args.n, args.k, device="cuda", dtype=torch.float16)
    y = mg.matmul(x, w)  # selection, module load
    torch.cuda.synchronize()
    dev = w.device.index
    choice = SELECTED[(w.signature, 1)]
    launcher = choice._launch
    stream = current_stream(dev)
    key = (w.signature, 1)
    rows = {
        "loop + lambda (baseline of every row)": lambda: None,
        "F.linear": lambda: F.linear(x, dense),
        "torch.add (one small torch launch)": lambda: torch.add(x, x),
        "mg.matmul": lambda: mg.matmul(x, w),
        "mg.matmul(out=y): no allocation": lambda: mg.matmul(x, w, out=y),
        "x.new_empty (the output allocation)": lambda: x.new_empty((1, args.n)),
        "selection lookup (dict get)": lambda: SELECTED.get(key),
        "current device + current stream": lambda: (_current_device(), current_stream(dev)),
        "Choice.launch (packing + driver)": lambda: choice.launch(x, w, None, y, 1, stream),
        f"{type(launcher).__name__} (packing + driver)": lambda: launcher(x, w, None, y, 1, stream),
    }
    fn, blocks = getattr(launcher, "fn", None), getattr(launcher, "_blocks", None)
    if fn is not None and blocks:  # the gemv launcher: its argument block is filled, launch it alone
        _, args_addr, grid, _, ring = next(iter(blocks.values()))
        smem = ring[1] if ring else None  # a ring's dynamic shared memory at M=1
        rows["Function.launch (ctypes cuLaunchKernel)"] = lambda: fn.launch(grid, stream, args_addr, smem)
    for f in rows.values():  # warm
        burst_us(f, args.calls)
    samples = {name: [] for name in rows}
    names = list(rows)
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            samples[name].append(burst_us(rows[name], args.calls))
    med = {name: statistics.median(v) for name, v in samples.items()}
    base = med[names[0]]
    print(f"# host µs per call, {args.n}x{args.k} int4 g128 at M=1 ({choice.running}); {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}; bursts of {args.calls}, median of {args.reps} alternating rounds; "
          f"'net' = minus the loop-and-lambda baseline ({base:.2f} µs)")
    print("| what | µs per call | net |\n|---|---|---|")
    for name in names:
        print(f"| {name} | {med[name]:.2f} | {med[name] - base:.2f} |")
    pieces = ["selection lookup (dict get)", "current device + current stream", "Choice.launch (packing + driver)"]
    glue = med["mg.matmul(out=y): no allocation"] - base - sum(med[p] - base for p in pieces)
    print(f"| checks and glue (mg.matmul(out=y) minus its timed pieces) | | {glue:.2f} |")
    print(f"\nmg.matmul / F.linear: {(med['mg.matmul'] - base) / (med['F.linear'] - base):.2f}x (net)")

    if args.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.cprofile):
            mg.matmul(x, w)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
