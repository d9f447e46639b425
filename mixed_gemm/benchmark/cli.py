"""``mixed-gemm bench``: the speed table a newcomer runs."""
from __future__ import annotations

import argparse
import datetime
import json

from ..profiler.cli import _common, prepare


def run_e2e(args: argparse.Namespace) -> int:
    import sys

    from ..profiler.timing import gpu_missing
    from . import e2e

    preset = args.model or "llama3-8b"
    if preset not in e2e.PRESETS:
        print(f"mixed-gemm bench --e2e: error: --model must be one of {', '.join(e2e.PRESETS)}", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in args.batches.split(",")]
        assert batches and all(b > 0 for b in batches)
    except (ValueError, AssertionError):
        print(f"mixed-gemm bench --e2e: error: --batches must be positive integers, got {args.batches!r}",
              file=sys.stderr)
        return 2
    why = gpu_missing()
    if why:
        print(f"mixed-gemm bench: {why}", file=sys.stderr)
        return 1
    import torch

    compiled = not args.no_compiled
    title = (f"{preset} ({args.layers or e2e.PRESETS[preset]['num_hidden_layers']} layers, random weights), fp16 vs "
             f"mixed_gemm int4 g128{'' if args.no_fuse else ' (q|k|v, gate|up fused)'} — {torch.cuda.get_device_name()}, {datetime.date.today()}; median of {args.reps}, "
             f"alternating; {e2e.PROMPT}-token prompt, {e2e.NEW_TOKENS} new tokens")
    print(f"# {title}", flush=True)
    result = e2e.run(preset, args.layers, batches, reps=args.reps, compiled=compiled, fuse=not args.no_fuse,
                     log=lambda line: print(line, flush=True))
    text = "\n".join([f"# {title}", ""] + e2e.table(result, compiled)) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, title=title), f, indent=1)
    if args.plot:
        why_not = e2e.plot(result, args.plot, title, compiled)
        print(f"plot: {why_not}" if why_not else f"plot: {args.plot}")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    if args.e2e:
        return run_e2e(args)
    ready = prepare(args, "bench")
    if isinstance(ready, int):
        return ready
    problems, ms = ready
    import torch

    from ..profiler.timing import copy_bandwidth
    from ..select import gpu_slug
    from . import report
    from .measure import WeightKind, bench_problem, eager_overhead, host_cost

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    kind = WeightKind(args.dtype, args.bits, args.group_size, "sym" if args.symmetric else "int")
    bw = copy_bandwidth()
    title = (f"mg.matmul vs torch {'fp16' if args.dtype == 'f16' else 'bf16'} — {props.name}, {datetime.date.today()}, copy bandwidth "
             f"{bw / 1e12:.2f} TB/s, int{args.bits} g{args.group_size} {'symmetric' if args.symmetric else 'with zeros'}, "
             "cold L2, CUDA graphs")
    print(f"# {title}", flush=True)
    rows = []
    for label, n, k in problems:
        new = bench_problem(label, n, k, ms, kind, bw, compare=args.compare)
        for line in report.table(new, args.compare)[2:]:
            print(line, flush=True)
        rows += new
    overhead = eager_overhead(kind)
    cost = host_cost(kind)
    tail = report.summary(rows, ms, args.compare) + ["", "Eager host overhead (tiny problem, µs per call): "
                                                     + ", ".join(f"{name} {sec * 1e6:.1f}" for name, sec in overhead.items())]
    tail += ["", "Host cost per call, M=1 x 4096 x 4096, 2000 calls (µs): "
             + ", ".join(f"{name} loop {c['loop_us']:.1f} / eager-graph {c['eager_minus_graph_us']:.1f}"
                         for name, c in cost.items())]
    errors = {r["tinygemm_error"] for r in rows if "tinygemm_error" in r}
    if errors:
        tail.append("tinygemm unavailable or failed: " + "; ".join(sorted(errors)))
    print("\n" + "\n".join(tail))
    text = "\n".join([f"# {title}", ""] + report.table(rows, args.compare) + [""] + tail) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows, "eager_overhead_s": overhead, "host_cost": cost}, f, indent=1)
    plot_path = args.plot or f"mixed_gemm_bench_{gpu_slug(props.name)}.png"
    why_not = report.plot(rows, ms, plot_path, title, args.compare)
    print(f"plot: {why_not}" if why_not else f"plot: {plot_path}")
    return 0


def add_bench_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="time mg.matmul against torch fp16 (and tinygemm) on model shapes; print a table, save a plot",
        description="For each shape and M: mg.matmul with the configuration selection picks, torch's "
                    "dense matmul in the same dtype, and with --compare PyTorch's tinygemm "
                    "(torch._weight_int4pack_mm, bf16). CUDA-graph replay on a cold L2. Prints µs, speedup "
                    "over torch and the share of the int4 memory floor; saves a PNG of speedup against M.")
    _common(parser, "1,16,64,256,4096")
    parser.add_argument("--symmetric", action="store_true", help="weights without zero points")
    parser.add_argument("--compare", action="store_true", help="add PyTorch's tinygemm (int4, bf16)")
    parser.add_argument("--plot", default="", help="PNG path (default: mixed_gemm_bench_<gpu>.png)")
    parser.add_argument("--out", default="", help="also write the tables (markdown) here")
    parser.add_argument("--json", default="", help="also write every measurement (JSON) here")
    e2e = parser.add_argument_group("end to end (--e2e)")
    e2e.add_argument("--e2e", action="store_true",
                     help="a transformers model of --model's shapes (default llama3-8b), random weights: decode "
                          "step, eager and compiled generate, time to first token, memory; fp16 vs int4")
    e2e.add_argument("--layers", type=int, default=0, help="decoder layers (default: the preset's)")
    e2e.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes (default: %(default)s)")
    e2e.add_argument("--reps", type=int, default=3, help="alternating repetitions, median (default: %(default)s)")
    e2e.add_argument("--no-compiled", action="store_true", help="skip the compiled (static cache) generate runs")
    e2e.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up as separate int4 launches")
    parser.set_defaults(func=run_bench)
    return parser
