"""What a small-token MoE layer waits on: ``mg.moe`` on a cold L2 against the same call with the
routed experts' down (w2) or gate|up (w13) bytes read into L2 just before it (a copy of their
codes, scales and zeros; the copy's own time, timed alone, is subtracted). If the layer is bound by
HBM bytes, serving half of them from L2 takes their share off; if it is bound by each CTA's chain
of round trips, little changes (docs/notes/moe.md, "The ragged token tiles ... measured").

    MIXED_GEMM_JIT=block python bench/moe_l2_probe.py --models qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b

Every variant is timed by ``profiler.timing.time_cold`` (a flush of twice the L2 before each call,
graph replays, variants alternating, medians). ``--flush write,read`` times them after each kind of
flush: the bench's write (zeroes, leaving dirty lines that are written back while the layer reads)
and a read (a clean L2). Equal times rule out the write-back as the cost of a cold first kernel.
"pages touched": the layer after a read of one element every 64 KB of its routed experts (their
address translations warm, almost nothing in L2): what the first touch of each page costs. Random int4 g128 experts (bench/moe_modes.py's
``packed_layer``), random softmax top-k routing. Prints one line per model and token count.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("MIXED_GEMM_JIT", "block")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from mixed_gemm.profiler.timing import time_cold  # noqa: E402
from mixed_gemm.profiler.workload import random_routing  # noqa: E402
from mixed_gemm.ops import moe  # noqa: E402
from moe_modes import packed_layer  # noqa: E402


def warm(stack, ids, frac: float):
    """A call that copies the first ``frac`` of each routed expert's codes, scales and zeros (so
    they sit in L2 afterwards); the buffers are made once, outside the timed call."""
    experts = sorted(set(int(e) for e in ids.flatten().tolist() if 0 <= int(e) < stack.num_experts))
    parts = [t[e].reshape(-1)[: int(t[e].numel() * frac)]
             for t in (stack.b, stack.scales, stack.zeros) if t is not None for e in experts]
    bufs = [torch.empty_like(p) for p in parts]

    def call():
        for b, p in zip(bufs, parts):
            b.copy_(p)
    return call


PAGE_STRIDE = 64 * 1024  # bytes between touches: every 64 KB, so 2 MB and 64 KB GPU pages alike


def touch_pages(stacks, ids):
    """A call that reads one element every :data:`PAGE_STRIDE` bytes of each routed expert's codes,
    scales and zeros in ``stacks``: their address translations warm, next to nothing in L2 (a 32-byte
    sector a page). Against the layer on a cold L2, it tells what the first touch of each page costs."""
    experts = sorted(set(int(e) for e in ids.flatten().tolist() if 0 <= int(e) < stacks[0].num_experts))
    views = []
    for stack in stacks:
        for t in (stack.b, stack.scales, stack.zeros):
            if t is None:
                continue
            for e in experts:
                flat = t[e].reshape(-1)
                step = max(1, PAGE_STRIDE // flat.element_size())
                idx = torch.arange(0, flat.numel(), step, device=flat.device)
                views.append((flat, idx, torch.empty(idx.numel(), dtype=flat.dtype, device=flat.device)))

    def call():
        for flat, idx, out in views:
            torch.index_select(flat, 0, idx, out=out)
    return call


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b")
    ap.add_argument("--tokens", default="1,2")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--flush", default="write", help="comma-separated: write (the bench's), read")
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        shape, w13, w2 = packed_layer(name, torch.float16)
        for t in map(int, args.tokens.split(",")):
            weights, ids = random_routing(t, shape, torch.Generator().manual_seed(3))
            x = torch.randn(t, shape.hidden, device="cuda", dtype=torch.float16)
            layer = lambda: moe(x, w13, w2, weights, ids)  # noqa: E731
            fns = {"layer": layer}
            variants = [("w2", w2, 1.0), ("w13", w13, 1.0)] + ([("w2 quarter", w2, 0.25)] if shape.experts <= 8 else [])
            for label, stack, frac in variants:
                w = warm(stack, ids, frac)
                fns[label] = w
                fns[label + "+layer"] = lambda w=w: (w(), layer())
            touch = touch_pages((w13, w2), ids)
            fns["pages"], fns["pages+layer"] = touch, lambda: (touch(), layer())
            for how in args.flush.split(","):
                us = {k: v[0] * 1e6 for k, v in time_cold(fns, rounds=args.rounds, eager=False, flush=how).items()}
                line = f"{name} T={t} ({how} flush): cold L2 {us['layer']:.1f} µs"
                for label, _, _ in variants:
                    line += f" | {label} in L2 {us[label + '+layer'] - us[label]:.1f}"
                line += f" | pages touched {us['pages+layer'] - us['pages']:.1f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
