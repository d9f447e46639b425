"""What a small decode GEMM cannot go below on this GPU, timed like `mixed-gemm bench` (cold L2,
back-to-back calls in a CUDA graph): an empty kernel (1 and 264 CTAs), a pure read of a weight's
bytes (Triton, 16-byte loads, one partial sum per program), torch's int4 tinygemm and mg.matmul at
M=1 on the same shapes.

    python bench/latency_floor.py [--shapes 4096:4096,6144:4096,4096:14336,8192:8192] [--bits 2 --group-size 64]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import mixed_gemm as mg
from mixed_gemm.profiler.timing import calls_for, copies_for, time_graph
from mixed_gemm.profiler.workload import packed_bytes, random_weights


@triton.jit
def _empty(out_ptr):
    pass


@triton.jit
def _read(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(v, axis=0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096:4096,6144:4096,4096:14336,8192:8192,28672:4096")
    ap.add_argument("--bits", type=int, default=4, help="weight width of the read and of mg.matmul (7: 1:2-sparse)")
    ap.add_argument("--group-size", type=int, default=128)
    a = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(1 << 16, dtype=torch.int32, device="cuda")
    for grid in (1, 2 * sms):
        t = time_graph(lambda i, g=grid: _empty[(g,)](out, num_warps=8), 64)
        print(f"empty kernel, {grid} CTAs: {t * 1e6:.2f} us", flush=True)
    for spec in a.shapes.split(","):
        n, k = map(int, spec.split(":"))
        qbytes = packed_bytes(n, k, a.bits, a.group_size, True)
        words = qbytes // 4
        copies = copies_for(qbytes, l2)
        bufs = [torch.randint(0, 1 << 20, (words,), dtype=torch.int32, device="cuda") for _ in range(copies)]
        row = [f"{n}x{k} ({qbytes / 1e6:.1f} MB, {qbytes / 3.0e12 * 1e6:.1f} us at 3.0 TB/s):"]
        for block in (2048, 8192):
            progs = triton.cdiv(words, block)
            fn = lambda i, b=block, p=progs: _read[(p,)](bufs[i % len(bufs)], out, words, BLOCK=b, num_warps=8)
            row.append(f"read B{block} ({progs} CTAs) {time_graph(fn, calls_for(fn, copies)) * 1e6:.2f} us")
        ws = random_weights(n, k, bits=a.bits, group_size=a.group_size, zero_mode="int", dtype="f16", copies=copies)
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        y = torch.empty(1, n, device="cuda", dtype=torch.float16)
        fn = lambda i: mg.matmul(x, ws[i % len(ws)], out=y)  # noqa: E731
        row.append(f"mg.matmul {time_graph(fn, calls_for(fn, copies)) * 1e6:.2f} us")
        del bufs, ws
        torch.cuda.empty_cache()
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
