"""The fused router against transformers' own (a linear of T rows, softmax, topk, the division, a
cast): µs per call on a cold L2 (``profiler.timing.time_cold``: CUDA graphs, flushes subtracted,
alternating, medians), for the routers of Qwen3-30B-A3B, Mixtral-8x7B and DeepSeek-V2-Lite at
several token counts; at one token also every split of the fused kernel (its CTA shape).

    MIXED_GEMM_JIT=block python bench/router_bench.py [--tokens 1,4,16,64] [--rounds 15]

Above ``MAX_TOKENS`` (where ``topk_router`` runs torch ops) the "fused" column is the kernel
``choose`` would take, launched directly: the data for moving that bound.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

from mixed_gemm.profiler.timing import time_cold  # noqa: E402
from mixed_gemm.kernels.router import FAMILY, MAX_TOKENS, SPLITS, RouterConfig, choose, tiled  # noqa: E402
from mixed_gemm.ops.router import _dtype_name, launch_router, router_reference, topk_router  # noqa: E402

# name: experts, hidden, top_k, renormalize, scale, weight dtype, logits dtype, scores dtype (transformers' routers)
ROUTERS = {
    "qwen3-30b-a3b": (128, 2048, 8, True, 1.0, torch.float16, torch.float16, torch.float16),
    "mixtral-8x7b": (8, 4096, 2, True, 1.0, torch.float16, torch.float16, torch.float32),
    "deepseek-v2-lite": (64, 2048, 6, False, 1.0, torch.float32, torch.float32, torch.float32),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; µs per call, cold L2")
    print("| router | tokens | transformers' ops | fused (chosen) | speedup | other shapes |")
    print("|---|---|---|---|---|---|")
    for name, (e, h, k, renorm, scale, wdt, ldt, sdt) in ROUTERS.items():
        w = (torch.randn(e, h, device="cuda") / h ** 0.5).to(wdt)
        counters = torch.zeros(4096, dtype=torch.int32, device="cuda")  # one per token tile
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, h, device="cuda", dtype=torch.float16)
            kw = dict(renormalize=renorm, scale=scale, logits_dtype=ldt, scores_dtype=sdt)
            fns = {"torch": lambda: router_reference(x, w, k, **kw),
                   "fused": lambda: topk_router(x, w, k, counters=counters, **kw)}
            if t > MAX_TOKENS:  # topk_router serves these in torch ops: the kernel choose() would take, forced
                forced = FAMILY.launcher(choose("f16", _dtype_name(wdt), _dtype_name(ldt), _dtype_name(sdt), t, h, e), 0)
                fns["fused"] = lambda ln=forced: launch_router(ln, x, w, k, renorm, scale, ldt, sdt, counters)
            if t == 1:
                chosen = choose("f16", _dtype_name(wdt), _dtype_name(ldt), _dtype_name(sdt), 1, h, e)
                for split in SPLITS:
                    cfg = RouterConfig(x="f16", w=_dtype_name(wdt), logits=_dtype_name(ldt), scores=_dtype_name(sdt),
                                       split=split, tokens=1)
                    launcher = FAMILY.launcher(cfg, 0)
                    fns[f"k{split}"] = (lambda ln=launcher: launch_router(ln, x, w, k, renorm, scale, ldt, sdt,
                                                                          counters))
            elif t <= counters.numel():  # one token a CTA, all warps on one expert: the single-token shape at this count
                cfg = RouterConfig(x="f16", w=_dtype_name(wdt), logits=_dtype_name(ldt), scores=_dtype_name(sdt),
                                   split=8, tokens=1)
                launcher = FAMILY.launcher(cfg, 0)
                fns["t1k8"] = lambda ln=launcher: launch_router(ln, x, w, k, renorm, scale, ldt, sdt, counters)
            if t > 1:  # the multi-token tile, whatever choose() takes
                tile = tiled("f16", _dtype_name(wdt), _dtype_name(ldt), _dtype_name(sdt), t, h)
                fns["tiled"] = lambda ln=FAMILY.launcher(tile, 0): launch_router(ln, x, w, k, renorm, scale, ldt, sdt,
                                                                                 counters)
            us = {n: s * 1e6 for n, (s, _) in time_cold(fns, args.rounds, eager=False).items()}
            splits = ", ".join(f"k{s} {us[f'k{s}']:.1f}" + ("*" if s == chosen.split else "") for s in SPLITS) \
                if t == 1 else f"one token a CTA, split 8: {us['t1k8']:.1f}" if "t1k8" in us else ""
            if t > 1:
                splits += f"; t{tile.tokens} k{tile.split}: {us['tiled']:.1f}"
            if t > MAX_TOKENS:
                splits += f" (fused forced: above MAX_TOKENS={MAX_TOKENS})"
            print(f"| {name} | {t} | {us['torch']:.1f} | {us['fused']:.1f} | {us['torch'] / us['fused']:.2f}x "
                  f"| {splits} |", flush=True)


if __name__ == "__main__":
    main()
