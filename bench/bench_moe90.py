"""Where a moe_sm90a MoE layer's time goes (issue #24): per preset and token count, the whole layer
(mg.moe forced onto each catalog tile), each projection's grouped GEMM alone, and, for scale, one
expert's share as a dense sm90a matmul (the profile's kernel for its M) times the active experts.
CUDA graphs, median of replays. Usage: python bench/bench_moe90.py --models mixtral-8x7b --tokens 256,4096"""
from __future__ import annotations

import argparse
import statistics

import torch

import mixed_gemm as mg
from mixed_gemm.benchmark.moe import MOE_MODELS, random_routing
from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_sm90a import MoeSm90aConfig
from mixed_gemm.kernels.moe_sm90a.catalog import TILES
from mixed_gemm.ops.experts import moe_grouped
from mixed_gemm.profiler.moe_sweep import _experts
from mixed_gemm.runtime import current_stream


def graph_us(fn, replays: int = 9) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite")
    ap.add_argument("--tokens", default="256,4096")
    args = ap.parse_args()
    fam = family("moe_sm90a")
    dev = torch.cuda.current_device()
    print("| model | tokens | tile | layer µs | w13 GEMM µs | w2 GEMM µs | TFLOP/s (GEMMs) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        shape = MOE_MODELS[name]
        w13 = _experts(shape.experts, 2 * shape.inter, shape.hidden, torch.float16, 13, gate_up=True)
        w2 = _experts(shape.experts, shape.hidden, shape.inter, torch.float16, 2)
        for t in map(int, args.tokens.split(",")):
            gen = torch.Generator().manual_seed(t)
            x = torch.randn(t, shape.hidden, generator=gen).to("cuda", torch.float16)
            weights, ids = random_routing(t, shape, gen)
            ids, weights = ids.contiguous(), weights.float().contiguous()
            pairs = t * shape.top_k
            flat = ids.reshape(-1)
            order = torch.sort(flat, stable=True).indices
            counts = torch.bincount(flat, minlength=shape.experts)
            offsets = torch.cumsum(counts, 0) - counts
            flops = 2 * pairs * shape.hidden * shape.inter * 3
            for tile in TILES:
                cfgs = (MoeSm90aConfig(stage="w13", tile=tile), MoeSm90aConfig(stage="w2", tile=tile))
                with mg.compile.blocking():
                    l13, l2 = fam.launcher(cfgs[0], dev), fam.launcher(cfgs[1], dev)
                layer = graph_us(lambda: moe_grouped(x, w13, w2, weights, ids, configs=cfgs))
                rows = x.index_select(0, order // shape.top_k)
                g = torch.empty(pairs, 2 * shape.inter, dtype=x.dtype, device="cuda")
                h = torch.randn(pairs, shape.inter, device="cuda").half()
                o = torch.empty(pairs, shape.hidden, dtype=x.dtype, device="cuda")
                g13 = graph_us(lambda: l13.gemm(rows, w13, counts, offsets, g, current_stream(dev)))
                g2 = graph_us(lambda: l2.gemm(h, w2, counts, offsets, o, current_stream(dev)))
                print(f"| {name} | {t} | {tile[0]}x{tile[1]}x{tile[2]} | {layer:.1f} | {g13:.1f} | {g2:.1f} | "
                      f"{flops / (g13 + g2) / 1e6:.0f} |", flush=True)
        del w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
