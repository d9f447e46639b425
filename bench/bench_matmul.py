"""Benchmark mg.matmul (int4, group 128, zero points) against torch fp16 on Llama-3 linear shapes.

Cold L2: each timed call reads a different copy of the weight, with enough copies that together
they exceed twice the L2. Calls are captured in a CUDA graph and timed with CUDA events (median of
replays), so launch gaps do not count. The int4 memory floor is the bytes of weights, scales,
zeros (packed 4-bit, as the checkpoint stores them), x and y over the copy bandwidth measured in
the same run.

    python bench/bench_matmul.py [--ms 1,16,64,256,4096] [--shapes 8b,70b] [--out FILE]
    python bench/bench_matmul.py --mode dequant     # mg.dequantize bandwidth on large weights
    python bench/bench_matmul.py --mode splitk      # decode time per split-K mode and factor
"""
from __future__ import annotations

import argparse
import datetime
import math

import torch

import mixed_gemm as mg
from mixed_gemm.profiler.timing import copy_bandwidth, time_graph
from mixed_gemm.formats.kernel_layout import pack_b, pack_group_params

SHAPES = {
    "8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
}
GROUP = 128


def _copies(nbytes: int, l2: int) -> int:
    return max(2, math.ceil(2 * l2 / nbytes) + 1)


def _packed_weights(n: int, k: int, copies: int):
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
    s = (torch.rand(n, k // GROUP, device="cuda") * 0.01 + 0.005).half()
    z = torch.randint(0, 16, (n, k // GROUP), device="cuda").half()
    base = mg.PackedWeight(b=pack_b(q, 4), scales=pack_group_params(s), zeros=pack_group_params(z),
                           n=n, k=k, bits=4, group_size=GROUP)
    del q
    out = [base]
    for _ in range(copies - 1):
        out.append(mg.PackedWeight(b=base.b.clone(), scales=base.scales.clone(), zeros=base.zeros.clone(),
                                   n=n, k=k, bits=4, group_size=GROUP))
    return out


def bench_shape(n: int, k: int, ms, l2: int, bw: float):
    rows = []
    int4_bytes = n * k // 2 + 2 * n * (k // GROUP) + n * (k // GROUP) // 2
    ws = _packed_weights(n, k, _copies(int4_bytes, l2))
    fp16 = [torch.randn(n, k, device="cuda").half() * 0.02 for _ in range(_copies(2 * n * k, l2))]
    for m in ms:
        x = torch.randn(m, k, device="cuda").half()
        y = torch.empty(m, n, device="cuda").half()
        it = iter(range(1 << 62))
        t_q = time_graph(lambda i: mg.matmul(x, ws[next(it) % len(ws)], out=y), calls=max(len(ws), 8))
        it2 = iter(range(1 << 62))
        t_f = time_graph(lambda i: torch.mm(x, fp16[next(it2) % len(fp16)].t(), out=y), calls=max(len(fp16), 8))
        floor = (int4_bytes + 2 * m * k + 2 * m * n) / bw
        rows.append(dict(n=n, k=k, m=m, us=t_q * 1e6, fp16_us=t_f * 1e6, speedup=t_f / t_q,
                         floor_share=floor / t_q, tflops=2 * m * n * k / t_q / 1e12))
    del ws, fp16
    torch.cuda.empty_cache()
    return rows


def bench_dequant(l2: int, bw: float):
    lines = ["| N | K | µs | GB/s (read + write) | share of copy bandwidth |", "|---|---|---|---|---|"]
    for n, k in [(28672, 4096), (10240, 8192), (57344, 8192), (8192, 28672)]:
        ws = _packed_weights(n, k, _copies(n * k // 2, l2))
        out = torch.empty(n, k, device="cuda").half()
        it = iter(range(1 << 62))
        t = time_graph(lambda i: mg.dequantize(ws[next(it) % len(ws)], out=out), calls=max(len(ws), 4))
        nbytes = n * k // 2 + 4 * n * (k // GROUP) + 2 * n * k
        lines.append(f"| {n} | {k} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | {100 * nbytes / t / bw:.0f}% |")
        print(lines[-1], flush=True)
        del ws, out
        torch.cuda.empty_cache()
    return lines


def bench_splitk(ms, l2: int):
    from mixed_gemm.select import heuristic_config

    lines = ["| N | K | M | heuristic | µs | none | serial 2 | parallel 4 | fused 2 | fused 4 | fused 8 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, k in SHAPES["8b"] + SHAPES["70b"]:
        ws = _packed_weights(n, k, _copies(n * k // 2, l2))
        for m in ms:
            x = torch.randn(m, k, device="cuda").half()
            y = torch.empty(m, n, device="cuda").half()
            h = heuristic_config(m, n=n, k=k, bits=4, zero_mode="int")
            variants = [h] + [h.replace(split_k_mode=md, split_k=f) for md, f in
                              [("none", 1), ("serial", 2), ("parallel", 4), ("fused", 2), ("fused", 4), ("fused", 8)]]
            times = []
            for cfg in variants:
                it = iter(range(1 << 62))
                times.append(time_graph(lambda i: mg.matmul(x, ws[next(it) % len(ws)], out=y, config=cfg),
                                         calls=max(len(ws), 8)) * 1e6)
            lines.append(f"| {n} | {k} | {m} | {h.split_k_mode} {h.split_k} | " + " | ".join(f"{t:.1f}" for t in times)
                         + " |")
            print(lines[-1], flush=True)
        del ws
        torch.cuda.empty_cache()
    return lines


def _emit(text: str, out) -> None:
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["matmul", "dequant", "splitk"], default="matmul")
    ap.add_argument("--ms", default="1,16,64,256,4096")
    ap.add_argument("--shapes", default="8b,70b")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ms = [int(v) for v in args.ms.split(",")]
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    bw = copy_bandwidth()
    if args.mode != "matmul":
        head = f"# {args.mode} — {props.name}, {datetime.date.today()}, copy bandwidth {bw / 1e12:.2f} TB/s\n"
        lines = [head] + (bench_dequant(l2, bw) if args.mode == "dequant" else bench_splitk(ms, l2))
        _emit("\n".join(lines) + "\n", args.out)
        return 0
    head = (f"# mg.matmul vs torch fp16 — {props.name}, {datetime.date.today()}, copy bandwidth "
            f"{bw / 1e12:.2f} TB/s, L2 {l2 >> 20} MiB, int4 g{GROUP} with zeros, cold L2, CUDA graphs\n")
    lines = [head, "| model | N | K | M | mg µs | fp16 µs | speedup | int4 floor share | TFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    all_rows = []
    for model in args.shapes.split(","):
        for n, k in SHAPES[model]:
            for r in bench_shape(n, k, ms, l2, bw):
                r["model"] = model
                all_rows.append(r)
                line = (f"| {model} | {n} | {k} | {r['m']} | {r['us']:.1f} | {r['fp16_us']:.1f} | "
                        f"{r['speedup']:.2f}x | {100 * r['floor_share']:.0f}% | {r['tflops']:.1f} |")
                lines.append(line)
                print(line, flush=True)
    lines.append("")
    lines.append("| M | geomean speedup over fp16 |")
    lines.append("|---|---|")
    for m in ms:
        sp = [r["speedup"] for r in all_rows if r["m"] == m]
        lines.append(f"| {m} | {math.exp(sum(map(math.log, sp)) / len(sp)):.2f}x |")
    _emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
