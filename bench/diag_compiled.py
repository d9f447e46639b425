"""Why a compiled generate is slower than its decode step: graph breaks, recompiles, cudagraph
skips (TORCH_LOGS) and, per new token, the CUDA graph launches and host time (torch.profiler).

    TORCH_LOGS=graph_breaks,recompiles,perf_hints python bench/diag_compiled.py [--model qwen3-30b-a3b] [--layers 4]
"""
from __future__ import annotations

import argparse
import collections

import torch

from mixed_gemm.integrations import e2e


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--which", default="int4,fp16")
    ap.add_argument("--sort", default="self_cpu_time_total", help="profiler table order (self_cuda_time_total: GPU time)")
    a = ap.parse_args()
    fp16, int4 = e2e.build_models(a.model, a.layers)
    models = {"fp16": fp16, "int4": int4}
    for name in a.which.split(","):
        model = models[name]
        print(f"== {name}: decode step in a graph {e2e.decode_step_ms(model, a.batch):.3f} ms", flush=True)
        for i in range(3):
            full = e2e.generate_s(model, a.batch, True)
            first = e2e.generate_s(model, a.batch, True, new_tokens=1)
            print(f"{name} compiled generate {full * 1e3:.1f} ms, first token {first * 1e3:.1f} ms, "
                  f"per later token {(full - first) / (e2e.NEW_TOKENS - 1) * 1e3:.3f} ms", flush=True)
        print(f"{name} dynamo counters:", {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if v}, flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            e2e.generate_s(model, a.batch, True)
        counts = collections.Counter(e.name for e in prof.events())
        print(f"{name}: per generate of {e2e.NEW_TOKENS} tokens:",
              {k: counts[k] for k in ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cudaStreamSynchronize",
                                      "cudaMemcpyAsync", "Torch-Compiled Region") if counts[k]})
        avg = prof.key_averages()
        try:
            print(avg.table(sort_by=a.sort, row_limit=18), flush=True)
        except (AttributeError, KeyError):  # older torch names device time "cuda"
            print(avg.table(sort_by=a.sort.replace("device", "cuda"), row_limit=18), flush=True)
        gpu_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in avg)
        print(f"{name}: GPU time per generate {gpu_us / 1e3:.2f} ms, per token {gpu_us / 1e3 / e2e.NEW_TOKENS:.3f} ms")
        torch._dynamo.utils.counters.clear()


if __name__ == "__main__":
    main()
