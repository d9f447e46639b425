"""Where one decode step's time goes: torch.profiler over one eager token forward (batch x 1, no KV
cache) of a random Llama-3-8B-shaped model, fp16 and int4 (mixed_gemm, fused projections), plus the
kernel launches per step and eager vs CUDA-graph step time. For bench/NOTES.md (issue #12)."""
from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from mixed_gemm.integrations import e2e


def _bucket(name: str) -> str:
    n = name.lower()
    for key, label in (("mg_sm80", "mixed_gemm GEMM"), ("_reduce", "split-K reduce"), ("mg_dequant", "dequantize"),
                       ("gemm", "cuBLAS GEMM"), ("gemv", "cuBLAS GEMV"), ("flash", "attention"), ("sdpa", "attention"),
                       ("attention", "attention"), ("elementwise", "elementwise"), ("reduce", "reductions (norms)"),
                       ("cat", "cat/copy"), ("copy", "cat/copy")):
        if key in n:
            return label
    return "other"


@torch.no_grad()
def step_profile(model, batch: int):
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    for _ in range(3):
        model(ids, use_cache=False)
    # Timed before the profiler runs: CUPTI's callbacks stay attached afterwards and slow every launch.
    eager = e2e._cuda_ms(lambda: model(ids, use_cache=False), reps=5)
    graph = e2e.decode_step_ms(model, batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(ids, use_cache=False)
        torch.cuda.synchronize()
    gpu = collections.Counter()
    launches = collections.Counter()
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        if t and evt.device_type == torch.autograd.DeviceType.CUDA:
            gpu[_bucket(evt.key)] += t
            launches[_bucket(evt.key)] += evt.count
    return gpu, launches, eager, graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    fp16, int4 = e2e.build_models("llama3-8b", args.layers)
    rows = {}
    for name, m in (("fp16", fp16), ("int4", int4)):  # timings of both before either is profiled
        ids = torch.randint(0, m.config.vocab_size, (args.batch, 1), device="cuda")
        for _ in range(3):
            m(ids, use_cache=False)
    times = {name: (e2e._cuda_ms(lambda m=m: m(torch.zeros(args.batch, 1, dtype=torch.long, device="cuda"),
                                                 use_cache=False), reps=5), e2e.decode_step_ms(m, args.batch))
             for name, m in (("fp16", fp16), ("int4", int4))}
    for name, m in (("fp16", fp16), ("int4", int4)):
        gpu, launches, _, _ = step_profile(m, args.batch)
        rows[name] = (gpu, launches, *times[name])
    labels = sorted(set(rows["fp16"][0]) | set(rows["int4"][0]), key=lambda k: -rows["fp16"][0].get(k, 0))
    print(f"One decode step, llama3-8b {args.layers} layers, batch {args.batch}: GPU µs (launches) per kernel class")
    print("| kernel class | fp16 µs | fp16 launches | int4 µs | int4 launches |")
    print("|---|---|---|---|---|")
    for k in labels:
        print(f"| {k} | {rows['fp16'][0].get(k, 0):.0f} | {rows['fp16'][1].get(k, 0)} | "
              f"{rows['int4'][0].get(k, 0):.0f} | {rows['int4'][1].get(k, 0)} |")
    for name in ("fp16", "int4"):
        gpu, launches, eager, graph = rows[name]
        print(f"{name}: GPU busy {sum(gpu.values()) / 1e3:.2f} ms, {sum(launches.values())} launches; step eager "
              f"{eager:.2f} ms, CUDA graph {graph:.2f} ms, host share {(eager - graph):.2f} ms")


if __name__ == "__main__":
    main()
