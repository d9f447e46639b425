"""One MoE layer at a few tokens: its kernels and their GPU durations (torch.profiler, cold L2) and
the layer's time per call from a CUDA graph of R x (flush, layer) minus a graph of R x flush.

    python bench/diag_moe_small.py [--model qwen3-30b-a3b] [--tokens 1,4]
"""
from __future__ import annotations

import argparse
import collections
import statistics

import torch

from mixed_gemm.benchmark.moe import MOE_MODELS, random_routing
from mixed_gemm.formats import quantize
from mixed_gemm.ops import moe, prepack_experts


def graph_of(fn, reps):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def time_g(g) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3  # µs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    shape = MOE_MODELS[a.model]
    gen = torch.Generator().manual_seed(0)
    packed = []
    for n, k, gate_up in ((2 * shape.inter, shape.hidden, True), (shape.hidden, shape.inter, False)):
        w = torch.randn(shape.experts, n, k, generator=gen) / k**0.5
        parts = [quantize(w[e].cuda(), bits=4, group_size=128) for e in range(shape.experts)]
        packed.append(prepack_experts(*(torch.stack([p[i] for p in parts]) for i in range(3)), bits=4, group_size=128,
                                      dtype=torch.float16, gate_up=gate_up))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    for t in map(int, a.tokens.split(",")):
        x = (torch.randn(t, shape.hidden, generator=gen) / 4).to("cuda", torch.float16)
        weights, ids = random_routing(t, shape, gen)
        weights_h = weights.to(torch.float16)
        for label, wts in (("fp32 weights", weights), ("fp16 weights", weights_h)):
            layer = lambda: moe(x, packed[0], packed[1], wts, ids)  # noqa: E731
            layer()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    flush.zero_()
                    layer()
                torch.cuda.synchronize()
            kern = collections.defaultdict(list)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    kern[ev.name[:70]].append(ev.device_time)
            print(f"{a.model} T={t} {label}: kernels per call (µs, median of 10)")
            for name, ds in kern.items():
                print(f"   {len(ds) / 10:4.1f} x {statistics.median(ds):7.2f}  {name}")
            g_both = graph_of(lambda: (flush.zero_(), layer()), a.reps)
            g_flush = graph_of(flush.zero_, a.reps)
            both = [time_g(g_both) for _ in range(7)]
            fl = [time_g(g_flush) for _ in range(7)]
            per = (statistics.median(both) - statistics.median(fl)) / a.reps
            print(f"   graph: {per:.1f} µs per layer call (R={a.reps} x (flush + layer) minus R x flush)", flush=True)


if __name__ == "__main__":
    main()
