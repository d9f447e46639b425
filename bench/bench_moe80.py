"""The moe_sm80 family (the Ampere path for many tokens per expert) against moe_gemv, the grouped
family that would otherwise run those tokens where moe_sm90a does not: one MoE layer per preset and
token count, mg.moe forced onto each family's heuristic configs and onto every moe_sm80 tile. CUDA
graphs, median of replays (warm L2: a relative comparison). On an H100 this is a proxy for Ampere.
Usage: python bench/bench_moe80.py --models mixtral-8x7b --tokens 64,256,1024"""
from __future__ import annotations

import argparse

import torch

import mixed_gemm as mg
from bench_moe90 import graph_us
from mixed_gemm.benchmark.moe import MOE_MODELS, random_routing
from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_sm80 import MoeSm80Config
from mixed_gemm.kernels.moe_sm80.catalog import SHAPES
from mixed_gemm.ops.experts import _problems, moe_grouped
from mixed_gemm.profiler.moe_sweep import _experts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mixtral-8x7b,qwen3-30b-a3b")
    ap.add_argument("--tokens", default="64,256,1024")
    args = ap.parse_args()
    gemv = family("moe_gemv")
    print("| model | tokens | moe_gemv µs | moe_sm80 heuristic µs | " + " | ".join(f"t{t[0]}x{t[1]}x{t[2]}" for t, _, _ in SHAPES)
          + " |")
    print("|---|---|---|---|" + "---|" * len(SHAPES))
    for name in args.models.split(","):
        shape = MOE_MODELS[name]
        w13 = _experts(shape.experts, 2 * shape.inter, shape.hidden, torch.float16, 13, gate_up=True)
        w2 = _experts(shape.experts, shape.hidden, shape.inter, torch.float16, 2)
        for t in map(int, args.tokens.split(",")):
            gen = torch.Generator().manual_seed(t)
            x = torch.randn(t, shape.hidden, generator=gen).to("cuda", torch.float16)
            weights, ids = random_routing(t, shape, gen)
            ids, weights = ids.contiguous(), weights.float().contiguous()
            problems = _problems(t, shape.top_k, w13, w2)

            def layer(cfgs):
                with mg.compile.blocking():
                    moe_grouped(x, w13, w2, weights, ids, configs=cfgs)
                return graph_us(lambda: moe_grouped(x, w13, w2, weights, ids, configs=cfgs))

            base = layer(tuple(gemv.heuristic(p, 132) for p in problems))
            heur = layer(tuple(family("moe_sm80").heuristic(p, 132) or MoeSm80Config(stage=p.stage) for p in problems))
            tiles = [layer(tuple(MoeSm80Config(stage=p.stage, tile=tl, warps=w, stages=s) for p in problems))
                     for tl, w, s in SHAPES]
            print(f"| {name} | {t} | {base:.1f} | {heur:.1f} | " + " | ".join(f"{v:.1f}" for v in tiles) + " |",
                  flush=True)
        del w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
