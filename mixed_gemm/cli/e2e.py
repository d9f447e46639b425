"""``mixed-gemm e2e``: the end-to-end decode benchmark of a transformers model (fp16 vs int4)."""
from __future__ import annotations

import argparse
import datetime
import json

from . import _args
from ._args import fail


def _presets():
    from ..integrations.e2e import PRESETS

    return PRESETS


def run_e2e(args: argparse.Namespace) -> int:
    import sys

    from ..profiler.timing import gpu_missing
    from ..integrations import e2e

    preset, batches = args.model, args.batches
    if args.compare and e2e.is_moe(preset):
        return fail("e2e", f"--compare: the tinygemm peer replaces nn.Linear layers only; {preset}'s experts would "
                           "stay fp16 (no MoE peer yet)")
    from ..integrations import e2e_moe

    if batches is None:
        batches = _args.positive_ints(e2e_moe.default_batches(preset))
    why = gpu_missing()
    if why:
        print(f"mixed-gemm e2e: {why}", file=sys.stderr)
        return 1
    import torch

    if e2e.is_moe(preset):
        in_turn, fp16_bytes = e2e_moe.one_at_a_time(preset, args.layers, torch.cuda.get_device_properties(0).total_memory)
        if in_turn:
            return _run_in_turn(args, preset, batches, fp16_bytes)
    compiled = not args.no_compiled
    title = (f"{preset} ({args.layers or e2e.PRESETS[preset]['num_hidden_layers']} layers, random weights), fp16 vs "
             f"mixed_gemm int4 g128{_fused(args, preset)}{f', lm_head {args.lm_head}' if args.lm_head else ''}{' vs tinygemm int4 g128 (bf16)' if args.compare else ''} — {torch.cuda.get_device_name()}, {datetime.date.today()}; median of {args.reps} (TTFT: of {max(args.reps, e2e.TTFT_REPS)}), "
             f"alternating; {e2e.PROMPT}-token prompt, {e2e.NEW_TOKENS} new tokens")
    # The table prints once: run logs its head and each row as it is measured, the memory table follows.
    print(f"# {title}\n", flush=True)
    result = e2e.run(preset, args.layers, batches, reps=args.reps, compiled=compiled, fuse=not args.no_fuse,
                     compare=args.compare, lm_head=args.lm_head, residual=not args.no_residual, routers=not args.no_router,
                     norms=not args.no_norms, unfused=not args.no_unfused, log=lambda line: print(line, flush=True))
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


def _fused(args: argparse.Namespace, preset: str) -> str:
    """What the int4 model fuses, for the table's title."""
    from ..integrations import e2e

    if args.no_fuse:
        return ""
    parts = ["q|k|v, gate|up fused"] + ([] if args.no_residual else ["residual epilogues"])
    parts += ["one-launch routers"] if e2e.is_moe(preset) and not args.no_router else []
    parts += [] if args.no_norms else ["one-launch norms"]
    return f" ({', '.join(parts)})"


def _run_in_turn(args: argparse.Namespace, preset: str, batches, fp16_bytes: int) -> int:
    """A mixture-of-experts preset too large for fp16 and int4 at once: :mod:`..integrations.e2e_moe`
    (compiled figures only; the table prints once, after both models)."""
    import sys

    import torch

    from ..integrations import e2e, e2e_moe

    if args.no_compiled:
        print(f"mixed-gemm e2e: error: --no-compiled: {preset} at these layers is measured one model at a time, "
              "compiled only", file=sys.stderr)
        return 2
    layers = args.layers or e2e.PRESETS[preset]["num_hidden_layers"]
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    title = (f"{preset} ({layers} layers, random weights), fp16 then mixed_gemm int4 g128"
             f"{_fused(args, preset)}"
             f"{f', lm_head {args.lm_head}' if args.lm_head else ''}, measured one after another, freed between: "
             f"{fp16_bytes / 1e9:.0f} GB of fp16 weights and an int4 copy do not fit the {gpu_gb:.0f} GB GPU together "
             f"— {torch.cuda.get_device_name()}, {datetime.date.today()}; median of {args.reps} per model (TTFT: of {max(args.reps, e2e.TTFT_REPS)}); compiled "
             f"step = Inductor, then one CUDA graph; compiled generate with a static cache, {e2e.PROMPT}-token prompt, "
             f"{e2e.NEW_TOKENS} new tokens")
    print(f"# {title}\n", flush=True)
    result = e2e_moe.run(preset, args.layers, batches, reps=args.reps, fuse=not args.no_fuse, lm_head=args.lm_head,
                         residual=not args.no_residual, routers=not args.no_router,
                         norms=not args.no_norms, log=lambda line: print(line, file=sys.stderr, flush=True))
    lines = e2e_moe.table(result)
    print("\n" + "\n".join(lines) + "\n", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join([f"# {title}", ""] + lines) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, title=title), f, indent=1)
    if args.plot:
        print("plot: not drawn for a one-model-at-a-time run (the table has its figures)")
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
    parser.add_argument("--model", default="llama3-8b", type=_args.presets(_presets, many=False),
                        help="preset: " + ", ".join(m for m in MODELS if not m.endswith("-unfused"))
                        + ", qwen3-30b-a3b (transformers' Qwen3-MoE; at its 48 layers fp16 and int4 are measured "
                          "one after another, compiled figures only)")
    parser.add_argument("--layers", type=_args.non_negative_int, default=0,
                        help="decoder layers (default, 0: the preset's)")
    parser.add_argument("--batches", default=None, type=_args.positive_ints,
                        help="comma-separated batch sizes (default: 1,16,64; 1,16 for qwen3-30b-a3b)")
    parser.add_argument("--reps", type=_args.positive_int, default=3,
                        help="alternating repetitions, median (default: %(default)s)")
    parser.add_argument("--no-compiled", action="store_true", help="skip the compiled (static cache) generate runs")
    parser.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up as separate int4 launches")
    parser.add_argument("--no-residual", action="store_true",
                        help="keep the decoder layers' skip connections as add kernels (default: fused into the "
                             "o_proj/down_proj epilogues, fuse_projections(residual=True))")
    parser.add_argument("--no-router", action="store_true",
                        help="keep a mixture-of-experts model's routers as transformers runs them (default: one "
                             "launch each, fuse_projections(routers=True))")
    parser.add_argument("--no-norms", action="store_true",
                        help="keep transformers' RMSNorms (eight kernels each; default: one launch each, "
                             "fuse_projections(norms=True))")
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
