"""A/B of decode schedules on the same weights: each case's schedules timed alternately (cold L2,
CUDA graphs, median of rounds) beside cuBLAS fp16, and checked against the float32 reference.

    python bench/ring_ab.py [--cases bench/ring_cases.txt] [--rounds 3] [--out FILE]

A case line: ``N K M BITS GROUP schedule [schedule ...]`` (``#`` comments). Prints one row per
(case, schedule): µs, speedup over fp16, and the weight's share of the 3.0 TB/s floor.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import mixed_gemm as mg
from mixed_gemm.kernels import parse_schedule
from mixed_gemm.profiler.timing import copies_for, time_graph
from mixed_gemm.profiler.workload import packed_bytes, random_weights

FLOOR_BW = 3.0e12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="bench/ring_cases.txt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--between", action="store_true",
                    help="an elementwise torch kernel (x *= 1) before every call, as a norm precedes a GEMM "
                         "in a model: times are then per pair")
    a = ap.parse_args()
    td = torch.float16 if a.dtype == "f16" else torch.bfloat16
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    lines = []
    for raw in open(a.cases):
        raw = raw.split("#")[0].split()
        if not raw:
            continue
        n, k, m, bits, group = map(int, raw[:5])
        schedules = raw[5:]
        qbytes = packed_bytes(n, k, bits, group, True)
        ws = random_weights(n, k, bits=bits, group_size=group, dtype=a.dtype, copies=copies_for(qbytes, l2))
        dense = [(torch.randn(n, k, device="cuda") * 0.02).to(td) for _ in range(copies_for(2 * n * k, l2))]
        x = torch.randn(m, k, device="cuda").to(td)
        y = torch.empty(m, n, device="cuda", dtype=td)
        want = mg.dequantize(ws[0]).float() @ x.float().t()
        cfgs = {}
        for s in schedules:
            cfg = parse_schedule(s, dtype=a.dtype, bits=bits, zero_mode="int")
            y.fill_(float("nan"))
            mg.matmul(x, ws[0], config=cfg, out=y)
            err = ((y.float().t() - want).abs().max() / want.abs().max()).item()
            cfgs[s] = (cfg, err)
        times = {s: [] for s in ["fp16", *schedules]}

        def pre():
            if a.between:
                x.mul_(1.0)

        def fp16(i):
            pre()
            torch.mm(x, dense[i % len(dense)].t(), out=y)

        def ours(i, c):
            pre()
            mg.matmul(x, ws[i % len(ws)], config=c, out=y)

        for _ in range(a.rounds):
            times["fp16"].append(time_graph(fp16, 2 * len(dense)))
            for s, (cfg, _) in cfgs.items():
                times[s].append(time_graph(lambda i, c=cfg: ours(i, c), 2 * len(ws)))
        fp = statistics.median(times["fp16"])
        for s in schedules:
            t = statistics.median(times[s])
            line = (f"{n}x{k} m={m} u{bits} g{group} {s:34s} {t * 1e6:8.1f} us  {fp / t:5.2f}x  "
                    f"floor {qbytes / FLOOR_BW / t:4.0%}  err {cfgs[s][1]:.1e}")
            print(line, flush=True)
            lines.append(line)
        del ws, dense
        torch.cuda.empty_cache()
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
