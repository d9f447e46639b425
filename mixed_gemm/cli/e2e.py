"""``mixed-gemm e2e``: the end-to-end decode benchmark of a transformers model (fp16 vs int4)."""
from __future__ import annotations

import argparse
import datetime
import json


def run_e2e(args: argparse.Namespace) -> int:
    import sys

    from ..profiler.timing import gpu_missing
    from ..integrations import e2e

    preset = args.model or "llama3-8b"
    if preset not in e2e.PRESETS:
        print(f"mixed-gemm e2e: error: --model must be one of {', '.join(e2e.PRESETS)}", file=sys.stderr)
        return 2
    if args.compare and e2e.is_moe(preset):
        print(f"mixed-gemm e2e: error: --compare: the tinygemm peer replaces nn.Linear layers only; {preset}'s "
              "experts would stay fp16 (no MoE peer yet)", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in args.batches.split(",")]
        assert batches and all(b > 0 for b in batches)
    except (ValueError, AssertionError):
        print(f"mixed-gemm e2e: error: --batches must be positive integers, got {args.batches!r}",
              file=sys.stderr)
        return 2
    why = gpu_missing()
    if why:
        print(f"mixed-gemm e2e: {why}", file=sys.stderr)
        return 1
    import torch

    compiled = not args.no_compiled
    title = (f"{preset} ({args.layers or e2e.PRESETS[preset]['num_hidden_layers']} layers, random weights), fp16 vs "
             f"mixed_gemm int4 g128{'' if args.no_fuse else ' (q|k|v, gate|up fused' + ('' if args.no_residual else ', residual epilogues') + ')'}{f', lm_head {args.lm_head}' if args.lm_head else ''}{' vs tinygemm int4 g128 (bf16)' if args.compare else ''} — {torch.cuda.get_device_name()}, {datetime.date.today()}; median of {args.reps}, "
             f"alternating; {e2e.PROMPT}-token prompt, {e2e.NEW_TOKENS} new tokens")
    # The table prints once: run logs its head and each row as it is measured, the memory table follows.
    print(f"# {title}\n", flush=True)
    result = e2e.run(preset, args.layers, batches, reps=args.reps, compiled=compiled, fuse=not args.no_fuse,
                     compare=args.compare, lm_head=args.lm_head, residual=not args.no_residual,
                     unfused=not args.no_unfused, log=lambda line: print(line, flush=True))
    print("\n" + "\n".join(e2e.memory_table(result)) + "\n")
    text = "\n".join([f"# {title}", ""] + e2e.table(result, compiled)) + "\n"
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


def add_e2e_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..profiler.problems import MODELS

    parser = subparsers.add_parser(
        "e2e", help="end to end: a transformers model of a preset's shapes, random weights, fp16 vs mixed_gemm int4",
        description="Builds a Llama-architecture model with --model's shapes (random weights, no download), "
                    "quantizes a copy with quantize_model (and fuse_projections), and reports per batch the "
                    "decode step in a CUDA graph, generate tokens/s eager (the fused model and, beside it, an "
                    "unfused int4 copy) and compiled (static cache, CUDA-graph trees), time to first token for a "
                    "512-token prompt and memory; the models' runs alternate and repeat (median). Kernels still "
                    "compiling in the background after the cold calls are waited for before anything is timed.")
    parser.add_argument("--model", default="llama3-8b",
                        help="preset: " + ", ".join(m for m in MODELS if not m.endswith("-unfused"))
                        + ", qwen3-30b-a3b (transformers' Qwen3-MoE: give a few --layers)")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (default: the preset's)")
    parser.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions, median (default: %(default)s)")
    parser.add_argument("--no-compiled", action="store_true", help="skip the compiled (static cache) generate runs")
    parser.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up as separate int4 launches")
    parser.add_argument("--no-residual", action="store_true",
                        help="keep the decoder layers' skip connections as add kernels (default: fused into the "
                             "o_proj/down_proj epilogues, fuse_projections(residual=True))")
    parser.add_argument("--no-unfused", action="store_true",
                        help="skip the int4 model without fusion (by default its eager generate is reported beside the "
                             "fused model's)")
    parser.add_argument("--compare", action="store_true",
                        help="also build the model with torch's tinygemm int4 (bf16, group 128, the same codes) and "
                             "report it beside fp16 and mixed_gemm in every row")
    parser.add_argument("--lm-head", choices=("int8", "int4"), default=None,
                        help="also quantize the int4 model's output head (quantize_model's lm_head=): int8 per "
                             "channel or int4 g128; default: fp16")
    parser.add_argument("--out", default="", help="also write the table (markdown) here")
    parser.add_argument("--json", default="", help="also write every measurement (JSON) here")
    parser.add_argument("--plot", default="", help="also save a PNG plot here")
    parser.set_defaults(func=run_e2e)
    return parser
