"""One decode problem launched ``--iters`` times with a forced schedule, for ``ncu`` to profile.

    ncu --clock-control none --kernel-name regex:mg_ --launch-skip 3 --launch-count 1 \
        python3 bench/ncu_case.py --n 57344 --k 8192 --m 1 --bits 2 --group 64 gemv:m8_s4_w2x2_u8_split2

Prints the schedule's median time (CUDA events, warm L2 is avoided by rotating weight copies).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from mixed_gemm.kernels import parse_schedule
from mixed_gemm.ops.matmul import matmul
from mixed_gemm.profiler.workload import random_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("schedule")
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
    cfg = parse_schedule(a.schedule, dtype=a.dtype, bits=a.bits, zero_mode="int")
    x = torch.randn(a.m, a.k, device="cuda").to(td)
    y = torch.empty(a.m, a.n, device="cuda", dtype=td)
    times = []
    for i in range(a.iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        matmul(x, ws[i % len(ws)], config=cfg, out=y)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    print(f"{a.schedule} n={a.n} k={a.k} m={a.m} bits={a.bits}: median {statistics.median(times[2:]):.1f} us (eager)")


if __name__ == "__main__":
    main()
