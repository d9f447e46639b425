"""``mixed-gemm profile``: sweep kernel schedules for shapes and M buckets; write the GPU's profile.
``mixed-gemm profile-moe``: the same for the grouped (MoE) kernels. The problem arguments
(``_common``, ``prepare``) are shared with ``mixed-gemm bench``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..profiler.problems import DEFAULT_MS, MODELS, parse_ints


WIDTHS = (1, 2, 3, 4, 7, 8)


def _widths(text: str):
    try:
        out = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        out = []
    if not out or any(b not in WIDTHS for b in out):
        raise argparse.ArgumentTypeError(f"expected comma-separated widths from {WIDTHS}, got {text!r}")
    return out


def _common(parser: argparse.ArgumentParser, ms_default: str, bits_list: bool = False) -> None:
    parser.add_argument("--model", default="", help=f"comma-separated presets: {', '.join(MODELS)}")
    parser.add_argument("--shapes", default="", help="comma-separated N:K pairs, e.g. 4096:4096,28672:4096")
    parser.add_argument("--ms", default=ms_default, help="comma-separated M values (default: %(default)s)")
    parser.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    if bits_list:
        parser.add_argument("--bits", type=_widths, default=[4],
                            help="comma-separated weight widths from 1, 2, 3, 4, 7 (1:2-sparse), 8 (default: 4)")
    else:
        parser.add_argument("--bits", type=int, choices=list(WIDTHS), default=4,
                            help="weight width (7: 1:2-sparse; 1-3 and 7 read the lowbit layout)")
    parser.add_argument("--group-size", type=int, default=128, help="-1 for per-channel (default: %(default)s)")


def problems_from(args, default_models: str):
    from ..profiler.problems import parse_ints, resolve

    problems = resolve(args.model or ("" if args.shapes else default_models), args.shapes)
    return problems, parse_ints(args.ms, "--ms")


def prepare(args, command: str):
    """Parse the problem arguments and check for a GPU: ``(problems, ms)``, or an exit code after
    printing why (2: bad arguments, 1: no GPU)."""
    from ..profiler.timing import gpu_missing

    try:
        problems, ms = problems_from(args, "llama3-8b,llama3-70b")
    except ValueError as exc:
        print(f"mixed-gemm {command}: error: {exc}", file=sys.stderr)
        return 2
    why = gpu_missing()
    if why:
        print(f"mixed-gemm {command}: {why}", file=sys.stderr)
        return 1
    return problems, ms


def run_profile(args: argparse.Namespace) -> int:
    ready = prepare(args, "profile")
    if isinstance(ready, int):
        return ready
    problems, ms = ready
    from ..profiler.sweep import SweepSpec, run_sweep

    spec = SweepSpec(problems=problems, ms=ms, dtype=args.dtype, bits=args.bits, group_size=args.group_size,
                     zero_mode=args.zero_mode, schedules=args.schedules.split(",") if args.schedules else None,
                     out=Path(args.out) if args.out else None, merge=not args.no_merge, fresh=args.fresh,
                     keep_faster=args.keep_faster,
                     replays=args.replays, progress=not args.quiet)
    profile, path = run_sweep(spec)
    print(f"wrote {path} ({len(profile.entries)} entries) and {path.with_suffix('.csv')}")
    return 0


def add_profile_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile", help="time the catalog's schedules (and dequantize+cuBLAS) per shape and M; write a profile",
        description="Time every candidate schedule for each shape and M bucket on this GPU (CUDA graphs, "
                    "cold L2, median of replays), verify the winners against torch.mm, and write "
                    "<gpu>.json (read by mg.matmul's selection) plus a CSV of every measurement. "
                    "An interrupted sweep resumes; results merge into an existing profile.")
    _common(parser, ",".join(map(str, DEFAULT_MS)))
    parser.add_argument("--zero-mode", choices=["int", "sym", "float", "offset"], default="int")
    parser.add_argument("--schedules", default="", help="time only these comma-separated schedules")
    parser.add_argument("--out", default="", help="profile path (default: <cache dir>/profiles/<gpu>.json)")
    parser.add_argument("--no-merge", action="store_true", help="replace the profile instead of merging into it")
    parser.add_argument("--keep-faster", action="store_true",
                        help="merging: keep an existing entry measured faster than the new winner (for --schedules sweeps)")
    parser.add_argument("--fresh", action="store_true", help="discard a partial sweep instead of resuming it")
    parser.add_argument("--replays", type=int, default=7, help="graph replays per measurement (median)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_profile)
    return parser


def run_profile_moe(args: argparse.Namespace) -> int:
    from ..profiler.timing import gpu_missing

    why = gpu_missing()
    if why:
        print(f"mixed-gemm profile-moe: {why}", file=sys.stderr)
        return 2
    import torch

    from ..benchmark.moe import MOE_MODELS
    from ..profiler.moe_sweep import run

    models = [m for m in args.model.split(",") if m]
    unknown = [m for m in models if m not in MOE_MODELS]
    if unknown:
        print(f"mixed-gemm profile-moe: --model: unknown preset {unknown[0]!r} (one of {', '.join(MOE_MODELS)})",
              file=sys.stderr)
        return 2
    try:
        tokens = parse_ints(args.tokens, "--tokens")
    except ValueError as exc:
        print(f"mixed-gemm profile-moe: {exc}", file=sys.stderr)
        return 2
    path = run(models, tokens, torch.float16 if args.dtype == "f16" else torch.bfloat16, args.out or None, args.replays)
    print(f"wrote {path} (grouped entries merged)")
    return 0


def add_profile_moe_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile-moe", help="time the grouped MoE kernels' schedules per preset, token count and projection",
        description="Time every grouped-family candidate (CUDA graphs, median of replays) for each MoE "
                    "preset's gate|up and down projections at each token count, on int4 g128 experts with "
                    "random routing; keep those whose output matches the heuristic schedule's; merge the "
                    "winners into <gpu>.json's grouped entries (read by mixed_gemm.moe).")
    parser.add_argument("--model", default="mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite", help="MoE presets")
    parser.add_argument("--tokens", default="1,2,4,8,16,32,64", help="comma-separated token counts")
    parser.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    parser.add_argument("--out", default="", help="profile path (default: <cache dir>/profiles/<gpu>.json)")
    parser.add_argument("--replays", type=int, default=7, help="graph replays per measurement (median)")
    parser.set_defaults(func=run_profile_moe)
    return parser
