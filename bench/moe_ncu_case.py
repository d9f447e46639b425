"""One MoE layer of a preset called ``--iters`` times, for Nsight Compute (``ncu``) to profile its
grouped GEMM launches (the MoE analog of ``bench/ncu_case.py``).

The plan is the one selection picks for the token count (the shipped profile, then the
heuristics), or the forced pair ``family:w13 schedule,family:w2 schedule`` given; it runs once
before the profiled calls, so every kernel is built (``MIXED_GEMM_JIT=block``) and the launches
ncu sees are the plan's. Each call launches the routing sort, the gather, the gate|up GEMM, the
down GEMM and the top-k sum; the GEMMs are the kernels named ``mg_moe_*`` (but moe_sm80's
routing kernels share its library's prefix: give such a plan a narrower ``NCU_MOE_REGEX``), so
``--kernel-name regex:mg_moe_ --launch-skip 2 --launch-count 2`` is the second call's two GEMMs
(gate|up, then down). ``bash bench/device/run.sh ncu-moe`` runs a list of these under ncu; by hand:

    ncu --clock-control none --kernel-name regex:mg_moe_ --launch-skip 2 --launch-count 2 \\
        python3 bench/moe_ncu_case.py --model qwen3-30b-a3b --tokens 4096 \\
        [moe_sm90s:w13_t256x128x64_s0_p,moe_sm90s:w2_t256x128x64_s0_p]

What it found first (Qwen3 at 4096 tokens: gate|up tensor-bound, down held by per-item costs):
docs/notes/moe.md, "What the 4096-token grouped GEMMs wait on".
"""
from __future__ import annotations

import argparse
import contextlib
import os

os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

from mixed_gemm.benchmark.moe import MOE_MODELS, build_layer, layer_inputs  # noqa: E402
from mixed_gemm.ops import moe  # noqa: E402
from mixed_gemm.ops.moe_grouped import forced_schedules  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan", nargs="?", default="",
                    help="family:w13_schedule,family:w2_schedule (default: what selection picks)")
    ap.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(MOE_MODELS))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--iters", type=int, default=2, help="profiled calls after the first")
    a = ap.parse_args()
    plan = a.plan.split(",") if a.plan else None
    if plan is not None and len(plan) != 2:
        ap.error("plan: two family:schedule names, gate|up then down, comma-separated")
    layer = build_layer(a.model, torch.float16 if a.dtype == "f16" else torch.bfloat16)
    x, weights, ids = layer_inputs(layer, a.tokens)
    with forced_schedules(*plan) if plan else contextlib.nullcontext():
        for _ in range(1 + a.iters):
            y = moe(x, layer.w13, layer.w2, weights, ids)
        torch.cuda.synchronize()
    print(f"{a.model} {a.tokens} tokens {a.dtype}, plan {a.plan or 'selected'}: |y| mean {float(y.float().abs().mean()):.4f}")


if __name__ == "__main__":
    main()
