"""GEMM epilogue fusions on the Llama-3 shapes, each measured against the same work done apart.

``--gated``: SiLU·mul in the gate|up epilogue, against gate|up then SiLU·mul.
1. The op alone, in CUDA graphs (20 calls per replay, median of 7): ``matmul`` + ``silu(g) * u``
   against ``silu_mul_matmul`` for the Llama-3 8B and 70B gate|up shapes at ``--rows`` rows
   (``GATED_MAX_ROWS`` raised to 16 so the fused kernel runs at every row count timed).
2. The Llama-3-8B-shaped decode step (``mixed_gemm.integrations.e2e``: ``--layers`` layers, random
   weights, int4 g128, fused projections, int4 lm_head) with every MLP's epilogue on and off (one
   model, ``FusedGateUpMLP.gated`` flipped), alternating with fp16, median of ``--reps``.

``--residual``: skip connections in the o_proj/down_proj epilogues, end to end. The same 8B-shaped
model twice: as ``e2e`` builds it, and a copy with ``fuse_residual`` (two add kernels per layer
fewer). fp16 and both int4 models alternate, median of ``--reps``:
- the decode step (batch x 1 token) replayed from a CUDA graph;
- one eager forward's wall time (median of 20) and eager ``generate`` tokens/s (host-bound:
  launches and Python count);
- with ``--compiled-batches``, the Inductor-compiled step captured in a graph (Inductor fuses the
  adds into the norms by itself, so this shows whether the epilogue costs anything there).

Without either flag both parts run, gated first. Results: bench/results/h100-epilogues.md.

    python bench/bench_epilogues.py [--gated] [--residual] [--layers 32] [--batches 1,16] [--out FILE]
    python bench/bench_epilogues.py --gated [--rows 1,2,4,8,16] [--layers 0: the op alone]
    python bench/bench_epilogues.py --residual [--compiled-batches 1] [--reps 3]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import mixed_gemm as mg  # noqa: E402
import mixed_gemm.ops.gated as gated_ops  # noqa: E402


def graph_us(fn, calls=20) -> float:
    """µs per call, ``calls`` calls captured in one CUDA graph (median of 7 replays)."""
    from mixed_gemm.profiler.timing import time_graph

    return time_graph(lambda i: fn(), calls) * 1e6


# --- SiLU·mul in the gate|up epilogue ---

def gated_op_rows(shapes, rows):
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

            a, b = graph_us(plain), graph_us(lambda: gated_ops.silu_mul_matmul(x, w))
            out.append(f"| {n}x{k} | {m} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {gated_ops.gated_kernel(w, m) or 'fallback'} |")
            print(out[-1], flush=True)
    return out


@torch.no_grad()
def gated_step_rows(layers, batches, reps):
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


def run_gated(args, batches):
    saved, gated_ops.GATED_MAX_ROWS = gated_ops.GATED_MAX_ROWS, 16  # the kernel at every row count timed (the library stops at 4)
    try:
        lines = gated_op_rows([(28672, 4096), (57344, 8192)], [int(r) for r in args.rows.split(",")]) + [""]
        if args.layers:
            lines += gated_step_rows(args.layers, batches, args.reps)
    finally:
        gated_ops.GATED_MAX_ROWS = saved
    return lines


# --- skip connections in the o_proj/down_proj epilogues ---

@torch.no_grad()
def eager_step_ms(model, batch: int, calls: int = 20) -> float:
    """Wall ms of one eager forward of batch x 1 token (no cache), median of ``calls``: the host's
    share of eager decoding (Python and launches), which the GPU step hides only when it is longer."""
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model(ids, use_cache=False)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_residual(args, batches):
    from mixed_gemm.integrations import e2e
    from mixed_gemm.integrations.fuse import fuse_residual

    compiled = [int(b) for b in args.compiled_batches.split(",") if b]
    fp16, int4 = e2e.build_models("llama3-8b", args.layers, fuse=True, lm_head="int4", residual=False)
    res = copy.deepcopy(int4)
    print(f"layers with the residual epilogue: {fuse_residual(res)}", flush=True)
    models = {"fp16": fp16, "int4": int4, "int4+res": res}
    metrics = {"step_ms": lambda m, b: e2e.decode_step_ms(m, b),
               "eager_step_ms": eager_step_ms,
               "eager_tps": lambda m, b: e2e.generate_tps(m, b, False)}
    for m in models.values():  # warm: loads, selection, first graphs
        for b in batches:
            for fn in metrics.values():
                fn(m, b)
            if b in compiled:
                e2e.compiled_step_ms(m, b)
    lines = ["| batch | model | step in a graph (ms) | eager step, wall (ms) | eager generate (tok/s) | compiled step (ms) |",
             "|---|---|---|---|---|---|"]
    for b in batches:
        samples = {k: {name: [] for name in list(metrics) + ["compiled_ms"]} for k in models}
        for rep in range(args.reps):
            order = list(models.items()) if rep % 2 == 0 else list(reversed(models.items()))
            for name, m in order:
                for key, fn in metrics.items():
                    samples[name][key].append(fn(m, b))
                if b in compiled:
                    samples[name]["compiled_ms"].append(e2e.compiled_step_ms(m, b))
        med = {k: {key: statistics.median(v) if v else float("nan") for key, v in s.items()} for k, s in samples.items()}
        for name in models:
            r = med[name]
            lines.append(f"| {b} | {name} | {r['step_ms']:.3f} ({med['fp16']['step_ms'] / r['step_ms']:.2f}x) | "
                         f"{r['eager_step_ms']:.2f} ({med['fp16']['eager_step_ms'] / r['eager_step_ms']:.2f}x) | "
                         f"{r['eager_tps']:.1f} ({r['eager_tps'] / med['fp16']['eager_tps']:.2f}x) | "
                         f"{r['compiled_ms']:.3f} ({med['fp16']['compiled_ms'] / r['compiled_ms']:.2f}x) |")
        print("\n".join(lines[-3:]), flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--gated", action="store_true", help="SiLU·mul in the gate|up epilogue: the op, then the 8B step")
    ap.add_argument("--residual", action="store_true", help="the residual add in the o_proj/down_proj epilogues: the 8B model")
    ap.add_argument("--layers", type=int, default=32, help="decoder layers of the 8B-shaped model (--gated: 0 skips the step)")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--reps", type=int, default=3, help="alternating rounds per batch, their median")
    ap.add_argument("--rows", default="1,2,4,8,16", help="--gated: rows of the op alone")
    ap.add_argument("--compiled-batches", default="", help="--residual: batches also timed compiled by Inductor")
    ap.add_argument("--out", default="", help="also write the tables here")
    args = ap.parse_args()
    parts = [p for p in ("gated", "residual") if getattr(args, p)] or ["gated", "residual"]
    batches = [int(b) for b in args.batches.split(",")]
    runs = {"gated": ("SiLU·mul in the gate|up epilogue", run_gated),
            "residual": ("Skip connections in the o_proj/down_proj epilogues", run_residual)}
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    for part in parts:
        title, run = runs[part]
        print(f"== {title}", flush=True)
        lines += [f"## {title}", ""] + run(args, batches) + [""]
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
