"""Skip connections in the o_proj/down_proj epilogues, measured end to end.

The Llama-3-8B-shaped model of ``mixed-gemm e2e`` (random weights, int4 g128, fused projections,
int4 lm_head) twice: as ``e2e`` builds it, and a copy with ``fuse_residual`` (two add kernels per
layer fewer). fp16 and both int4 models alternate, median of ``--reps``:
- the decode step (batch x 1 token) replayed from a CUDA graph;
- one eager forward's wall time (median of 20) and eager ``generate`` tokens/s (host-bound:
  launches and Python count);
- with ``--compiled-batches``, the Inductor-compiled step captured in a graph (Inductor fuses the
  adds into the norms by itself, so this shows whether the epilogue costs anything there).

    python bench/bench_residual.py [--layers 32] [--batches 1,16] [--compiled-batches 1] [--out FILE]
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

from mixed_gemm.integrations import e2e  # noqa: E402
from mixed_gemm.integrations.fuse import fuse_residual  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--compiled-batches", default="")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
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
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
