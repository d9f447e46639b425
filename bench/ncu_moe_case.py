"""One MoE layer (a preset's random int4 g128 experts, random routing) called ``--iters`` times, for
Nsight Compute (``ncu``) to profile one launch of its kernels: ``bench/ncu_case.py``'s counterpart
for the grouped families. The plan is the one ``mg.moe`` selects, or ``--plan`` (two
``family:schedule`` names, gate|up then down), built first so the profiled launch is that kernel.

    ncu --clock-control none --kernel-name regex:mg_moe_f16_u4_w2 --launch-skip 3 --launch-count 1 \\
        --section SourceCounters -o rep python3 bench/ncu_moe_case.py --model qwen3-30b-a3b --tokens 1
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv && python bench/ncu_stalls.py rep.csv
"""
from __future__ import annotations

import argparse
import contextlib
import os

os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

from mixed_gemm.ops import moe  # noqa: E402
from mixed_gemm.ops.moe_grouped import forced_schedules, grouped_plan  # noqa: E402
from mixed_gemm.profiler.workload import random_routing  # noqa: E402
from moe_modes import packed_layer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--plan", default="", help="gate|up and down as family:schedule,family:schedule (default: selected)")
    ap.add_argument("--iters", type=int, default=8)
    a = ap.parse_args()
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    shape, w13, w2 = packed_layer(a.model, dtype)
    gen = torch.Generator().manual_seed(1000 + a.tokens)
    x = (torch.randn(a.tokens, shape.hidden, generator=gen) / 4).to("cuda", dtype)
    weights, ids = random_routing(a.tokens, shape, gen)
    with forced_schedules(*a.plan.split(",")) if a.plan else contextlib.nullcontext():
        print("plan:", grouped_plan(x, w13, w2, shape.top_k))
        for _ in range(a.iters):
            moe(x, w13, w2, weights, ids)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
