"""The MoE layer with a router's 16-bit top-k weights read as they are (pair and persistent modes
of moe_gemv) against the same weights cast to fp32 first (what ran before: a cast launch a layer):
µs per call on a cold L2 from CUDA graphs (``profiler.timing.time_cold``, alternating, medians), per
model preset and token count.

    MIXED_GEMM_JIT=block python bench/moe_weights_ab.py [--models qwen3-30b-a3b,deepseek-v2-lite] [--tokens 1,4,16]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

import mixed_gemm as mg  # noqa: E402
from mixed_gemm.benchmark.moe import MOE_MODELS, build_layer  # noqa: E402
from mixed_gemm.profiler.timing import time_cold  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b")
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; µs per layer call, cold L2, CUDA graphs")
    print("| model | tokens | fp16 weights, cast to fp32 first | read as fp16 | saved |\n|---|---|---|---|---|")
    for name in args.models.split(","):
        layer = build_layer(name, torch.float16)
        shape = MOE_MODELS[name]
        for t in (int(v) for v in args.tokens.split(",")):
            gen = torch.Generator().manual_seed(t)
            x = torch.randn(t, shape.hidden, generator=gen).to("cuda", torch.float16)
            scores = torch.rand(t, shape.experts, generator=gen)
            top = scores.topk(shape.top_k, dim=1)
            weights = (top.values / top.values.sum(1, keepdim=True)).to("cuda", torch.float16)
            ids = top.indices.to("cuda")
            fns = {"cast": lambda: mg.moe(x, layer.w13, layer.w2, weights.float(), ids),
                   "native": lambda: mg.moe(x, layer.w13, layer.w2, weights, ids)}
            assert torch.equal(fns["cast"](), fns["native"]())
            us = {n: s * 1e6 for n, (s, _) in time_cold(fns, args.rounds, eager=False).items()}
            print(f"| {name} | {t} | {us['cast']:.1f} | {us['native']:.1f} | {us['cast'] - us['native']:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
