"""SiLU·mul in the gate|up epilogue, measured against gate|up then SiLU·mul.

1. The op alone, in CUDA graphs (20 calls per replay, median of 7): ``matmul`` + ``silu(g) * u``
   against ``silu_mul_matmul`` for the Llama-3 8B and 70B gate|up shapes at 1-16 rows.
2. The Llama-3-8B-shaped decode step (``mixed_gemm.integrations.e2e``: 32 layers, random weights,
   int4 g128, fused projections, int4 lm_head) with every MLP's epilogue on and off (one model,
   ``FusedGateUpMLP.gated`` flipped), alternating with fp16, median of 3.

    python bench/bench_gated.py [--layers 32] [--batches 1,16] [--out FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import mixed_gemm as mg  # noqa: E402
from mixed_gemm.ops.gated import gated_kernel, silu_mul_matmul  # noqa: E402
from mixed_gemm.profiler.timing import time_graph  # noqa: E402


def graph_us(fn, calls=20) -> float:
    """µs per call, ``calls`` calls captured in one CUDA graph (median of 7 replays)."""
    return time_graph(lambda i: fn(), calls) * 1e6


def op_rows(shapes, rows):
    out = ["| gate|up (2I x K) | rows | matmul + SiLU·mul µs | fused µs | speedup | fused kernel |", "|---|---|---|---|---|---|"]
    for n, k in shapes:
        q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
        s = (torch.rand(n, k // 128, device="cuda") + 0.5).half() * (2 / (16 * k**0.5))
        z = torch.randint(0, 16, (n, k // 128), device="cuda").half()
        w = mg.prepack(q, s, z, format="plain", bits=4, group_size=128)
        for m in rows:
            x = torch.randn(m, k, device="cuda").half()

            def plain():
                g, u = mg.matmul(x, w).split(n // 2, dim=-1)
                return torch.nn.functional.silu(g) * u

            a, b = graph_us(plain), graph_us(lambda: silu_mul_matmul(x, w))
            out.append(f"| {n}x{k} | {m} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {gated_kernel(w, m) or 'fallback'} |")
            print(out[-1], flush=True)
    return out


@torch.no_grad()
def step_rows(layers, batches, reps=3):
    from mixed_gemm.integrations.e2e import build_models, decode_step_ms
    from mixed_gemm.integrations.fuse import FusedGateUpMLP

    fp16, int4 = build_models("llama3-8b", layers, lm_head="int4")
    mlps = [m for m in int4.modules() if isinstance(m, FusedGateUpMLP)]
    assert mlps
    out = ["| batch | fp16 ms | int4, SiLU·mul separate ms | int4, in the epilogue ms | step speedup over fp16 (separate -> epilogue) |",
           "|---|---|---|---|---|"]
    for batch in batches:
        t = {"fp16": [], "off": [], "on": []}
        for _ in range(reps):
            t["fp16"].append(decode_step_ms(fp16, batch))
            for flag in ("off", "on"):
                for m in mlps:
                    m.gated = flag == "on"
                t[flag].append(decode_step_ms(int4, batch))
        f, off, on = (statistics.median(t[key]) for key in ("fp16", "off", "on"))
        out.append(f"| {batch} | {f:.3f} | {off:.3f} | {on:.3f} | {f / off:.2f}x -> {f / on:.2f}x |")
        print(out[-1], flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    mg.ops.gated.GATED_MAX_ROWS = 16  # the kernel at every row count timed here (the library stops at 4)
    lines += op_rows([(28672, 4096), (57344, 8192)], [int(r) for r in args.rows.split(",")]) + [""]
    if args.layers:
        lines += step_rows(args.layers, [int(b) for b in args.batches.split(",")])
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
