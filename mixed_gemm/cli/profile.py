"""``mixed-gemm profile``: sweep kernel schedules for shapes and M buckets; write the GPU's profile.
``mixed-gemm profile-moe``: the same for the grouped (MoE) kernels. The problem arguments
(``_common``, ``prepare``) are shared with ``mixed-gemm bench``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..profiler.problems import DEFAULT_MS, MODELS
from . import _args


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
    parser.add_argument("--model", default="", type=_args.presets(lambda: MODELS),
                        help=f"comma-separated presets: {', '.join(MODELS)}")
    parser.add_argument("--shapes", default="", type=_args.shapes,
                        help="comma-separated N:K pairs, e.g. 4096:4096,28672:4096")
    parser.add_argument("--ms", default=ms_default, type=_args.positive_ints,
                        help="comma-separated M values (default: %(default)s)")
    parser.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    if bits_list:
        parser.add_argument("--bits", type=_widths, default=[4],
                            help="comma-separated weight widths from 1, 2, 3, 4, 7 (1:2-sparse), 8 (default: 4)")
    else:
        parser.add_argument("--bits", type=int, choices=list(WIDTHS), default=4,
                            help="weight width (7: 1:2-sparse; 1-3 and 7 read the lowbit layout)")
    parser.add_argument("--group-size", type=_args.group_size, default=128,
                        help="-1 for per-channel, else a power of two >= 32 (default: %(default)s)")


def problems_from(args, default_models: str):
    from ..profiler.problems import resolve

    problems = resolve(args.model or ("" if args.shapes else default_models), args.shapes)
    return problems, args.ms


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


def _dense_families():
    from ..kernels import FAMILIES

    return [fam.name for fam in FAMILIES]


def _grouped_families():
    from ..kernels import GROUPED_FAMILIES

    return [fam.name for fam in GROUPED_FAMILIES]


def run_profile(args: argparse.Namespace) -> int:
    ready = prepare(args, "profile")
    if isinstance(ready, int):
        return ready
    problems, ms = ready
    from ..profiler.sweep import SweepSpec, run_sweep

    spec = SweepSpec(problems=problems, ms=ms, dtype=args.dtype, bits=args.bits, group_size=args.group_size,
                     zero_mode=args.zero_mode, schedules=args.schedules.split(",") if args.schedules else None,
                     families=args.families.split(",") if args.families else None,
                     against_profile=args.against_profile,
                     out=Path(args.out) if args.out else None, merge=not args.no_merge, fresh=args.fresh,
                     keep_faster=args.keep_faster,
                     replays=args.replays, jobs=args.jobs, progress=not args.quiet)
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
    parser.add_argument("--families", default="", type=_args.presets(_dense_families, noun="family"),
                        help="time only these comma-separated families' candidates (e.g. sm90s)")
    parser.add_argument("--against-profile", action="store_true",
                        help="also time the profile's current entry for each shape and M, in the same run, so that "
                             "a --families sweep replaces it only when faster")
    parser.add_argument("--out", default="", help="profile path (default: <cache dir>/profiles/<gpu>.json)")
    parser.add_argument("--no-merge", action="store_true", help="replace the profile instead of merging into it")
    parser.add_argument("--keep-faster", action="store_true",
                        help="merging: keep an existing entry measured faster than the new winner (for --schedules "
                             "sweeps), unless this sweep timed that entry's schedule too (--against-profile)")
    parser.add_argument("--fresh", action="store_true", help="discard a partial sweep instead of resuming it")
    parser.add_argument("--replays", type=_args.positive_int, default=7, help="graph replays per measurement (median)")
    parser.add_argument("--jobs", type=_args.positive_int, default=None,
                        help="nvcc processes compiling the candidates before they are timed (default: CPU count)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_profile)
    return parser


def run_profile_moe(args: argparse.Namespace) -> int:
    from ..profiler.timing import gpu_missing

    why = gpu_missing()
    if why:
        print(f"mixed-gemm profile-moe: {why}", file=sys.stderr)
        return 1
    import torch

    from ..profiler.moe_sweep import run

    models = [m for m in args.model.split(",") if m]
    path = run(models, args.tokens, torch.float16 if args.dtype == "f16" else torch.bfloat16, args.out or None,
               args.replays, families=args.families.split(",") if args.families else None,
               against_profile=args.against_profile, bits=args.bits, jobs=args.jobs)
    print(f"wrote {path} (grouped entries merged)")
    return 0


def _moe_presets():
    from ..benchmark.moe import MOE_MODELS

    return MOE_MODELS


def add_profile_moe_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile-moe", help="time the grouped MoE kernels' schedules per preset, token count and projection",
        description="Time every grouped-family candidate (CUDA graphs, median of replays) for each MoE "
                    "preset's gate|up and down projections at each token count, on int4 (or --bits 8) g128 experts with "
                    "random routing; keep those whose output matches the heuristic schedule's; merge the "
                    "winners into <gpu>.json's grouped entries (read by mixed_gemm.moe).")
    parser.add_argument("--model", default="mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite",
                        type=_args.presets(_moe_presets), help="comma-separated MoE presets (default: %(default)s)")
    parser.add_argument("--tokens", default="1,2,4,8,16,32,64", type=_args.positive_ints,
                        help="comma-separated token counts (default: %(default)s)")
    parser.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    parser.add_argument("--bits", type=int, choices=[4, 8], default=4, help="the experts' weight width (g128, zeros)")
    parser.add_argument("--families", default="", type=_args.presets(_grouped_families, noun="family"),
                        help="time only these comma-separated grouped families' candidates (e.g. moe_sm90s)")
    parser.add_argument("--against-profile", action="store_true",
                        help="also time the profile's current entry for each stage and token count, in the same "
                             "run, so that a --families sweep replaces it only when faster")
    parser.add_argument("--out", default="", help="profile path (default: <cache dir>/profiles/<gpu>.json)")
    parser.add_argument("--replays", type=_args.positive_int, default=7, help="graph replays per measurement (median)")
    parser.add_argument("--jobs", type=_args.positive_int, default=None,
                        help="nvcc processes compiling the candidates before they are timed (default: CPU count)")
    parser.set_defaults(func=run_profile_moe)
    return parser
