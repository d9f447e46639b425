"""Where an MoE layer's time goes on the GPU: mg.moe on one preset and token count under the torch
profiler, its CUDA kernels' total time per name (median-free: summed over --reps calls, divided).
Usage: python bench/diag_moe_stages.py --model mixtral-8x7b --tokens 4096"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch

import mixed_gemm as mg
from mixed_gemm.benchmark.moe import MOE_MODELS, random_routing
from mixed_gemm.profiler.moe_sweep import _experts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    shape = MOE_MODELS[args.model]
    try:
        w13 = _experts(shape.experts, 2 * shape.inter, shape.hidden, torch.float16, 13, gate_up=True)
    except TypeError:  # a tree from before gate|up stacks (the A/B's old side)
        w13 = _experts(shape.experts, 2 * shape.inter, shape.hidden, torch.float16, 13)
    w2 = _experts(shape.experts, shape.hidden, shape.inter, torch.float16, 2)
    for t in map(int, args.tokens.split(",")):
        gen = torch.Generator().manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen).to("cuda", torch.float16)
        weights, ids = random_routing(t, shape, gen)
        for _ in range(3):
            mg.moe(x, w13, w2, weights, ids)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.reps):
                mg.moe(x, w13, w2, weights, ids)
            torch.cuda.synchronize()
        per = defaultdict(float)
        grouped = []  # the grouped GEMMs' launches in order: gate|up, down, gate|up, ...
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name[:70]] += ev.device_time_total / args.reps
                if ev.name.startswith("mg_moe"):
                    grouped.append(ev.device_time_total)
        if len(grouped) >= 2:
            gate_up, down = sorted(grouped[0::2])[len(grouped) // 4], sorted(grouped[1::2])[len(grouped) // 4]
            print(f"  grouped GEMMs, median: gate|up {gate_up:.1f} µs, down {down:.1f} µs")
        total = sum(per.values())
        print(f"## {args.model} T={t}: {total:.1f} µs of kernels per call")
        for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {us:9.1f} µs  {name}")


if __name__ == "__main__":
    main()
