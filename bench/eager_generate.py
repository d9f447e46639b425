"""Eager ``generate`` of a preset's fp16 model against its int4 twin fused as the README advises
(``fuse_projections(model, residual=True)``) and an unfused int4 twin: all alive in one process,
their runs alternating (order reversed every other repetition), median per batch. Transformers'
dynamic cache, a 16-token prompt and 48 new tokens, as ``mixed-gemm e2e``.

Before timing: one cold ``generate`` per model and batch (its seconds are printed: they include
module loads and, with ``$MIXED_GEMM_JIT=async``, background builds), then a wait for the kernels
still compiling in the background; any selection still running a stand-in (a kernel missing from
the installed kernel package and the cache) is named, since it, not the chosen kernel, is timed.

``--profile B``: one more ``generate`` per model at batch B under torch.profiler (GPU activity
only): GPU busy time against the wall, launches, and the kernels that differ most between the
models (which launch costs what). ``--kernels``: the kernel every int4 selection runs.

    python bench/eager_generate.py [--layers 32] [--batches 1,16,64] [--reps 5] [--profile 64] [--kernels]
    MIXED_GEMM_JIT=off python bench/eager_generate.py   # only packaged or cached kernels
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import time

import torch

import mixed_gemm
from mixed_gemm.compile import jit_mode, packages
from mixed_gemm.integrations import e2e


def generate_ms(model, batch: int) -> float:
    return e2e.generate_s(model, batch, compiled=False) * 1e3


def generate_wall_cpu_ms(model, batch: int):
    """(wall ms, this thread's CPU ms) of one generate. Eager generate is bound by its Python
    thread, so the CPU time is the work the host did for the model: unlike the wall time it does
    not count the time a busy host took the core away (docs/notes/end-to-end.md)."""
    c = time.thread_time()
    wall = generate_ms(model, batch)
    return wall, (time.thread_time() - c) * 1e3


def short(name: str) -> str:
    """A kernel's name without namespaces and argument list, template arguments cut at 80 characters
    (the functor tells torch's elementwise kernels apart; ours are plain C names)."""
    if name.startswith("mg_"):
        return name
    if "cutlass::device_kernel" in name:
        return "cutlass device_kernel (the sm90a GEMMs)"
    name = re.sub(r"^void |\(anonymous namespace\)::|\b(at::native|at|c10|std)::", "", name)
    head, _, tail = name.partition("<")
    depth, out = 1, []
    for ch in tail if tail else "":  # the template arguments, up to their closing bracket
        depth += (ch == "<") - (ch == ">")
        if depth == 0:
            break
        out.append(ch)
    return (head.split("::")[-1] + (f"<{''.join(out)}>" if tail else ""))[:80]


@torch.no_grad()
def kernel_profile(model, batch: int):
    """(wall ms, {short kernel name: [GPU µs, launches]}) of one eager generate."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, model.config.vocab_size, (batch, e2e.PROMPT), device="cuda")
    kw = dict(max_new_tokens=e2e.NEW_TOKENS, min_new_tokens=e2e.NEW_TOKENS, do_sample=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3
    agg = collections.defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[short(evt.name)]
            a[0] += evt.time_range.elapsed_us()
            a[1] += 1
    return wall, dict(agg)


def quant_signatures(model) -> set:
    from mixed_gemm.nn import QuantLinear

    return {m.packed().signature for m in model.modules() if isinstance(m, QuantLinear)}


def kernel_lines(models) -> list:
    """``N x K, M <= bucket: family:schedule (source)`` of every selection the int4 models made."""
    from mixed_gemm.select.selection import SELECTED

    users = collections.defaultdict(list)
    for name, model in models.items():
        for sig in quant_signatures(model):
            users[sig].append(name)
    lines = []
    for (sig, bucket), choice in sorted(SELECTED.items(), key=lambda kv: (kv[0][0][:2], kv[0][1])):
        if sig in users:
            run = "" if choice.standin is None else f" STAND-IN RUNS: {choice.running}"
            lines.append(f"  {sig[0]}x{sig[1]} M<={bucket}: {choice.schedule} ({choice.source}){run}"
                         f" [{', '.join(users[sig])}]")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=[p for p in e2e.PRESETS if not e2e.is_moe(p)])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions per batch (median)")
    ap.add_argument("--profile", type=int, default=0, metavar="BATCH", help="profile one generate per model here")
    ap.add_argument("--kernels", action="store_true", help="list the kernel of every int4 selection")
    ap.add_argument("--json", default="")
    ap.add_argument("--pin", type=int, default=-1, metavar="CPU",
                    help="pin the main (host-bound) thread to this CPU before timing: less migration noise")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    print(f"# eager generate, {args.model} {args.layers} layers, {e2e.PROMPT}-token prompt + {e2e.NEW_TOKENS} new "
          f"tokens; {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"transformers {__import__('transformers').__version__}, mixed_gemm {mixed_gemm.__version__}")
    print(f"# MIXED_GEMM_JIT={os.environ.get('MIXED_GEMM_JIT', '')!r} ({jit_mode()}); kernel packages: "
          f"{'; '.join(packages.summary()) or 'none'}")
    t = time.perf_counter()
    fp16, fused = e2e.build_models(args.model, args.layers)  # fuse_projections(residual=True)
    models = {"fp16": fp16, "fused": fused, "unfused": e2e.build_unfused(fp16)}
    print(f"# models built in {time.perf_counter() - t:.0f} s")

    cold = {(n, b): generate_ms(m, b) / 1e3 for b in batches for n, m in models.items()}
    print("cold first generate, s: " + "; ".join(
        f"batch {b}: " + ", ".join(f"{n} {cold[(n, b)]:.1f}" for n in models) for b in batches))
    standins = e2e.settle_kernels()
    print("stand-ins still running: " + ("; ".join(standins) if standins else "none"))
    for b in batches:  # warm: every selection switched to its chosen kernel, modules loaded
        for m in models.values():
            generate_ms(m, b)

    if args.pin >= 0:
        os.sched_setaffinity(0, {args.pin})  # this thread only: the driver's threads stay free
        print(f"# main thread pinned to CPU {args.pin}")
    samples = {(n, b): [] for n in models for b in batches}
    cpu = {(n, b): [] for n in models for b in batches}
    order = list(models.items())
    for b in batches:
        for rep in range(args.reps):
            for name, model in (order if rep % 2 == 0 else order[::-1]):
                wall, host = generate_wall_cpu_ms(model, b)
                samples[(name, b)].append(wall)
                cpu[(name, b)].append(host)
    med = {k: statistics.median(v) for k, v in samples.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    print("\n| batch | fp16 ms | fused ms | fused vs fp16 | unfused ms | unfused vs fp16 | fused tok/s | "
          "spread max/min fp16, fused, unfused |")
    print("|---|---|---|---|---|---|---|---|")
    for b in batches:
        spread = ", ".join(f"{max(samples[(n, b)]) / min(samples[(n, b)]):.2f}" for n in models)
        print(f"| {b} | {med[('fp16', b)]:.1f} | {med[('fused', b)]:.1f} | {med[('fp16', b)] / med[('fused', b)]:.2f}x | "
              f"{med[('unfused', b)]:.1f} | {med[('fp16', b)] / med[('unfused', b)]:.2f}x | "
              f"{b * e2e.NEW_TOKENS / med[('fused', b)] * 1e3:.0f} | {spread} |")
    print("\nhost thread CPU ms per generate (median; what eager generate is bound by):")
    print("| batch | " + " | ".join(f"{n} CPU ms" for n in models) + " | fused vs fp16 | unfused vs fp16 |")
    print("|---|" + "---|" * (len(models) + 2))
    for b in batches:
        print(f"| {b} | " + " | ".join(f"{med_cpu[(n, b)]:.1f}" for n in models) +
              f" | {med_cpu[('fp16', b)] / med_cpu[('fused', b)]:.2f}x | {med_cpu[('fp16', b)] / med_cpu[('unfused', b)]:.2f}x |")
    result = {"cold_s": {f"{n}@{b}": v for (n, b), v in cold.items()}, "standins": standins,
              "ms": {f"{n}@{b}": v for (n, b), v in samples.items()},
              "cpu_ms": {f"{n}@{b}": v for (n, b), v in cpu.items()}}

    if args.profile:
        b = args.profile
        prof = {n: kernel_profile(m, b) for n, m in models.items()}
        print(f"\nprofiled generate at batch {b}: wall ms / GPU busy ms / launches: " + "; ".join(
            f"{n} {w:.0f} / {sum(v[0] for v in k.values()) / 1e3:.0f} / {sum(v[1] for v in k.values())}"
            for n, (w, k) in prof.items()))
        us = lambda n, kn: prof[n][1].get(kn, [0.0])[0]  # noqa: E731
        names = sorted(set().union(*(k for _, k in prof.values())))
        # The kernels whose time differs most between the fused and the unfused model, then the fused one's largest.
        top = sorted(names, key=lambda kn: -abs(us("fused", kn) - us("unfused", kn)))[:8]
        top += [kn for kn in sorted(names, key=lambda kn: -us("fused", kn)) if kn not in top][:6]
        print("| kernel | " + " | ".join(f"{n} µs | launches" for n in models) + " |")
        print("|---|" + "---|---|" * len(models))
        for kn in top:
            cells = " | ".join(f"{prof[n][1].get(kn, [0, 0])[0]:.0f} | {prof[n][1].get(kn, [0, 0])[1]}" for n in models)
            print(f"| {kn[:70]} | {cells} |")
        result["profile"] = {n: {"wall_ms": w, "kernels": k} for n, (w, k) in prof.items()}

    if args.kernels:
        print("\nint4 selections (shape, M bucket: kernel (source) [models]):")
        print("\n".join(kernel_lines({n: m for n, m in models.items() if n != "fp16"})))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
