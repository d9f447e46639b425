"""``mixed-gemm bench``: the speed table a newcomer runs."""
from __future__ import annotations

import argparse
import datetime
import json

from ..benchmark.limits import DEFAULT_MS
from ._args import fail, positive_int, positive_ints
from .profile import _common, prepare


def run_bench_moe(args: argparse.Namespace) -> int:
    """``--moe``: the MoE layer table (:mod:`..benchmark.moe`), with ``--compare`` humming-kernels'
    MoE path beside, with ``--breakdown`` mg.moe's time per stage (:mod:`..benchmark.moe_breakdown`)."""
    import sys

    from ..profiler.timing import gpu_missing
    from ..benchmark.moe import MOE_MODELS

    names = [m for m in args.moe.split(",") if m]
    tokens = args.tokens
    if any(m not in MOE_MODELS for m in names) or not names:
        return fail("bench", f"--moe takes comma-separated presets from {', '.join(MOE_MODELS)}, got {args.moe!r}")
    if args.repeat > 1:
        return fail("bench", f"--repeat applies to the dense tables; --moe alternates its paths itself, got --repeat "
                             f"{args.repeat}")
    why = gpu_missing()
    if why:
        print(f"mixed-gemm bench: {why}", file=sys.stderr)
        return 1
    import torch

    from ..benchmark import moe as bench
    from ..benchmark.moe_breakdown import breakdown, table
    from ..profiler.timing import copy_bandwidth

    dtype = torch.float16 if args.dtype == "f16" else torch.bfloat16
    title = (f"MoE layer, mg.moe (int4 g{args.group_size}) vs the best {args.dtype} path"
             f"{' and humming-kernels (int4, the same codes)' if args.compare else ''} — {torch.cuda.get_device_name()}, "
             f"{datetime.date.today()}, this run's copy rate {copy_bandwidth() / 1e12:.2f} TB/s; random routing, cold L2, "
             "CUDA graphs where capturable (g) else eager (e), median; ideal fp16 = max(touched experts' fp16 bytes at "
             "3.0 TB/s, FLOPs at 740 TFLOP/s), int4 floor = touched experts' codes + scales + zeros at 3.0 TB/s; "
             "speedup and vs X = the other time over mg's (above 1: mg faster), of int4 floor = floor over mg's time")
    head = bench.table_head(args.compare)
    print(f"# {title}\n\n" + "\n".join(head), flush=True)
    rows, stages = [], []
    for name in names:
        layer = bench.build_layer(name, dtype, group_size=args.group_size)
        rows += bench.bench_moe(layer, tokens, compare=args.compare, log=lambda line: print(line, flush=True))
        if args.breakdown:
            stages += breakdown(layer, tokens)
        del layer
        torch.cuda.empty_cache()
    tail = bench.notes(rows)
    lines = [f"# {title}", ""] + head + [bench.table_line(r, args.compare) for r in rows]
    lines += [""] + tail if tail else []
    if tail:
        print("\n" + "\n".join(tail), flush=True)
    if stages:
        lines += [""] + table(stages)
        print("\n" + "\n".join(table(stages)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows, "breakdown": stages}, f, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    if args.moe:
        return run_bench_moe(args)
    ready = prepare(args, "bench")
    if isinstance(ready, int):
        return ready
    problems, ms = ready
    import torch

    from ..profiler.timing import copy_bandwidth
    from ..select import gpu_slug
    from ..benchmark import report
    from ..benchmark.measure import WeightKind, bench_problem, eager_overhead, host_cost

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bw = copy_bandwidth()
    texts, rows, overhead, cost, by_bits = [], [], {}, {}, {}
    for bits in args.bits:
        kind = WeightKind(args.dtype, bits, args.group_size, "sym" if args.symmetric else "int")
        what = "1:2-sparse int7" if bits == 7 else f"int{bits}"
        title = (f"mg.matmul vs torch {'fp16' if args.dtype == 'f16' else 'bf16'} — {props.name}, {datetime.date.today()}, "
                 f"copy bandwidth {bw / 1e12:.2f} TB/s, {what} g{args.group_size} "
                 f"{'symmetric' if args.symmetric else 'with zeros'}, cold L2, CUDA graphs"
                 + (f", median of {args.repeat} alternated runs" if args.repeat > 1 else ""))
        print(f"# {title}", flush=True)
        new_rows = []
        for label, n, k in problems:
            new = bench_problem(label, n, k, ms, kind, bw, compare=args.compare, repeat=args.repeat)
            for line in report.table(new, args.compare)[2:]:
                print(line, flush=True)
            new_rows += new
        for r in new_rows:
            r["bits"] = bits
        by_bits[bits] = new_rows
        rows += new_rows
        tail = report.summary(new_rows, ms, args.compare)
        tail += report.notes(new_rows)
        print("\n" + "\n".join(tail) + "\n", flush=True)
        texts += [f"# {title}", ""] + report.table(new_rows, args.compare) + [""] + tail + [""]
    kind = WeightKind(args.dtype, args.bits[0], args.group_size, "sym" if args.symmetric else "int")
    overhead = eager_overhead(kind)
    cost = host_cost(kind)
    tail = []
    if len(args.bits) > 1:
        tail += report.by_width(by_bits, ms, args.compare) + [""]
    tail += ["Eager host overhead (tiny problem, µs per call): "
             + ", ".join(f"{name} {sec * 1e6:.1f}" for name, sec in overhead.items())]
    tail += ["", "Host cost per call, M=1 x 4096 x 4096, 2000 calls (µs): "
             + ", ".join(f"{name} loop {c['loop_us']:.1f} / eager-graph {c['eager_minus_graph_us']:.1f}"
                         for name, c in cost.items())]
    print("\n".join(tail))
    text = "\n".join(texts + tail) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows, "eager_overhead_s": overhead, "host_cost": cost}, f, indent=1)
    rows = by_bits[args.bits[0]]
    plot_path = args.plot or f"mixed_gemm_bench_{gpu_slug(props.name)}.png"
    why_not = report.plot(rows, ms, plot_path, title, args.compare)
    print(f"plot: {why_not}" if why_not else f"plot: {plot_path}")
    return 0


def add_bench_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="time mg.matmul against torch fp16 (and tinygemm) on model shapes; print a table, save a plot",
        description="For each shape and M: mg.matmul with the configuration selection picks, torch's "
                    "dense matmul in the same dtype, and with --compare the peers: PyTorch's tinygemm "
                    "(torch._weight_int4pack_mm, bf16), gemlite and humming-kernels where installed (a peer "
                    "that is missing or cannot run the weight is skipped with a note). CUDA-graph replay on a "
                    "cold L2. Prints per shape and M the µs, the speedup over torch, the limit (fp16 time over "
                    "max(weight bytes at 3.0 TB/s, FLOPs at 740 TFLOP/s)), the share of that limit reached and "
                    "the weight-byte floor share; saves a PNG of speedup against M.")
    _common(parser, DEFAULT_MS, bits_list=True)
    parser.add_argument("--symmetric", action="store_true", help="weights without zero points")
    parser.add_argument("--compare", action="store_true",
                        help="add the peers: PyTorch's tinygemm (int4, bf16), gemlite (2/4/8 bits) and humming-kernels "
                             "(int4/int8, group-wise zeros), where installed")
    parser.add_argument("--plot", default="", help="PNG path (default: mixed_gemm_bench_<gpu>.png)")
    parser.add_argument("--out", default="", help="also write the tables (markdown) here")
    parser.add_argument("--json", default="", help="also write every measurement (JSON) here")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="time mg.matmul and torch this many times each, alternately, and report each side's "
                             "median (a noisy host's drift then falls on both sides; peers are timed once)")
    parser.add_argument("--moe", default="", metavar="PRESETS",
                        help="instead: one mixture-of-experts layer per preset (mixtral-8x7b, qwen3-30b-a3b, "
                             "deepseek-v2-lite), mg.moe on int4 experts vs the best fp16/bf16 path, the ideal fp16 "
                             "time and the int4 floor of the experts the routing touches; --compare adds "
                             "humming-kernels' MoE path")
    parser.add_argument("--tokens", default="1,4,16,64,256,4096", type=positive_ints,
                        help="with --moe: comma-separated token counts (default: %(default)s)")
    parser.add_argument("--breakdown", action="store_true",
                        help="with --moe: also mg.moe's time per stage (routing sort, routing bookkeeping, gathers, "
                             "the two grouped GEMMs, SiLU*up, the top-k combine), one table per preset")
    parser.set_defaults(func=run_bench)
    return parser
