"""Kernel studies: dequantize bandwidth and split-K at decode (the speed tables are `mixed-gemm bench`;
docs/benchmarks.md).

Same method as `mixed-gemm bench` (mixed_gemm.profiler.timing): cold L2 through rotating weight
copies, CUDA-graph replay, CUDA events, median of replays.

    python bench/bench_matmul.py --mode dequant     # mg.dequantize bandwidth on large weights
    python bench/bench_matmul.py --mode splitk      # decode time per split-K mode and factor
"""
from __future__ import annotations

import argparse
import datetime

import torch

import mixed_gemm as mg
from mixed_gemm.profiler.problems import MODELS, parse_ints
from mixed_gemm.profiler.timing import copies_for, copy_bandwidth, time_graph
from mixed_gemm.profiler.workload import packed_bytes, random_weights
from mixed_gemm.kernels.sm80.heuristics import heuristic_config
from mixed_gemm.select import sm_count

GROUP = 128
SHAPES = [(n, k) for model in ("llama3-8b", "llama3-70b") for _, n, k in MODELS[model]]


def _weights(n: int, k: int, l2: int):
    return random_weights(n, k, group_size=GROUP, copies=copies_for(packed_bytes(n, k, 4, GROUP), l2))


def bench_dequant(l2: int, bw: float):
    lines = ["| N | K | µs | GB/s (read + write) | share of copy bandwidth |", "|---|---|---|---|---|"]
    for n, k in [(28672, 4096), (10240, 8192), (57344, 8192), (8192, 28672)]:
        ws = _weights(n, k, l2)
        out = torch.empty(n, k, device="cuda").half()
        t = time_graph(lambda i: mg.dequantize(ws[i % len(ws)], out=out), calls=max(len(ws), 4))
        nbytes = n * k // 2 + 4 * n * (k // GROUP) + 2 * n * k
        lines.append(f"| {n} | {k} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | {100 * nbytes / t / bw:.0f}% |")
        print(lines[-1], flush=True)
        del ws, out
        torch.cuda.empty_cache()
    return lines


def bench_splitk(ms, l2: int):
    variants = [("none", 1), ("serial", 2), ("parallel", 4), ("fused", 2), ("fused", 4), ("fused", 8)]
    lines = ["| N | K | M | heuristic | µs | " + " | ".join(f"{md} {f}" if f > 1 else md for md, f in variants) + " |",
             "|---|---|---|---|---|" + "---|" * len(variants)]
    for n, k in SHAPES:
        ws = _weights(n, k, l2)
        for m in ms:
            x = torch.randn(m, k, device="cuda").half()
            y = torch.empty(m, n, device="cuda").half()
            h = heuristic_config(m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", sms=sm_count(0))
            times = [time_graph(lambda i: mg.matmul(x, ws[i % len(ws)], out=y, config=cfg), calls=max(len(ws), 8)) * 1e6
                     for cfg in [h] + [h.replace(split_k_mode=md, split_k=f) for md, f in variants]]
            lines.append(f"| {n} | {k} | {m} | {h.split_k_mode} {h.split_k} | " + " | ".join(f"{t:.1f}" for t in times)
                         + " |")
            print(lines[-1], flush=True)
        del ws
        torch.cuda.empty_cache()
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["dequant", "splitk"], required=True)
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    head = f"# {args.mode} — {props.name}, {datetime.date.today()}, copy bandwidth {bw / 1e12:.2f} TB/s\n"
    body = bench_dequant(props.L2_cache_size, bw) if args.mode == "dequant" else \
        bench_splitk(parse_ints(args.ms, "--ms"), props.L2_cache_size)
    text = "\n".join([head] + body) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
