"""One matmul problem launched ``--iters`` times, for Nsight Compute (``ncu``) to profile one launch.

The schedule is the one given, else the one selection picks for the problem (the shipped profile,
then the heuristics); either is compiled first if missing, so the profiled launch is that kernel and
not a stand-in. ``bash bench/device/run.sh ncu`` runs a list of these under ncu; by hand:

    ncu --clock-control none --kernel-name regex:mg_ --launch-skip 3 --launch-count 1 \\
        python3 bench/ncu_case.py --n 57344 --k 8192 --m 1 --bits 2 --group 64 [gemv:m8_s4_w2x2_u8_p3_split2]

Prints the schedule and its median eager time (CUDA events; the weight copies rotate, so with
``--copies`` large enough the L2 is cold: not needed for ncu, which flushes caches itself).
"""
from __future__ import annotations

import argparse
import statistics

import torch

import mixed_gemm as mg
from mixed_gemm.kernels import parse_schedule
from mixed_gemm.profiler.workload import random_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("schedule", nargs="?", default="", help="family:schedule (default: what selection picks)")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--copies", type=int, default=2)
    a = ap.parse_args()
    td = torch.float16 if a.dtype == "f16" else torch.bfloat16
    ws = random_weights(a.n, a.k, bits=a.bits, group_size=a.group, dtype=a.dtype, copies=a.copies)
    cfg = parse_schedule(a.schedule, dtype=a.dtype, bits=a.bits, zero_mode="int") if a.schedule else None
    name = a.schedule or mg.explain(a.m, ws[0]).schedule
    x = torch.randn(a.m, a.k, device="cuda").to(td)
    y = torch.empty(a.m, a.n, device="cuda", dtype=td)
    times = []
    with mg.blocking():
        for i in range(a.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            mg.matmul(x, ws[i % len(ws)], config=cfg, out=y)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3)
    print(f"{name} n={a.n} k={a.k} m={a.m} bits={a.bits} g{a.group}: median {statistics.median(times[2:]):.1f} us (eager)")


if __name__ == "__main__":
    main()
