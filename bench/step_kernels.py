"""Where a compiled decode step's time goes, kernel by kernel: a preset's random-weight model, fp16
and its mixed_gemm int4 twin (``e2e.build_models``: fused projections and routers), each compiled by
Inductor and captured in one CUDA graph as ``mixed-gemm e2e`` times it; the graph replayed under
torch.profiler. Prints per model the step, GPU busy time, launches and the top kernels (µs per step,
launches, µs per launch).

    python bench/step_kernels.py --model qwen3-30b-a3b --layers 8 [--batch 1] [--lm-head int8] [--top 40]
"""
from __future__ import annotations

import argparse
import collections
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from mixed_gemm.integrations import e2e


def step_kernels(model, batch: int, reps: int = 10):
    """``(graph step µs, {kernel: µs per step}, {kernel: launches per step})``."""
    with e2e.decoding_experts(model), torch.no_grad():
        fn = torch.compile(model, dynamic=False)
        ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
        for _ in range(3):
            fn(ids, use_cache=False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(ids, use_cache=False)
        graph.replay()
        step = statistics.median(e2e.cuda_ms(graph.replay, reps=20) for _ in range(5)) * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
    us, count = collections.Counter(), collections.Counter()
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            us[evt.name] += evt.time_range.elapsed_us() / reps
            count[evt.name] += 1 / reps
    return step, us, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lm-head", choices=("int8", "int4"), default=None)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    fp16, int4 = e2e.build_models(args.model, args.layers, lm_head=args.lm_head)
    for name, model in (("fp16", fp16), ("int4", int4)):
        step, us, count = step_kernels(model, args.batch)
        busy = sum(us.values())
        print(f"== {name}, {args.model} {args.layers} layers, batch {args.batch}: graph step {step:.1f} µs, "
              f"GPU busy {busy:.1f} µs, {sum(count.values()):.0f} launches")
        for kernel, t in us.most_common(args.top):
            print(f"  {t:8.1f} µs {count[kernel]:5.0f}x {t / count[kernel]:7.2f}  {kernel[:150]}")


if __name__ == "__main__":
    main()
