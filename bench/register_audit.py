"""ptxas registers and spill bytes of the kernels a profile names, in this tree and at another commit:
which winners a template change moved since they were timed. A kernel that now needs more
registers than it had (fewer CTAs per SM) or spills runs slower than its entry says; re-time
those entries (``mixed-gemm profile --against-profile``). No GPU: nvcc and ptxas only.

    python bench/register_audit.py --base 8a99a06 [--profile profiles/h100.json] [--families gemv]
                                   [--jobs 2]

Each kernel is compiled from ``generated/<name>.cu`` of each tree (``--base``: a temporary git
worktree) for sm_90a (``mixed_gemm.compile.ptxas_usage``), with that tree's templates and this
tree's CUTLASS. Only the
kernels whose figures differ are printed, with the entries that name them (kernels added since the
base are only counted). CUTLASS 3.x families
(sm90a, moe_sm90a) take minutes a kernel: leave them out unless asked for (``--families``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mixed_gemm.compile import BuildError, ptxas_usage
from mixed_gemm.kernels import parse_schedule

ROOT = Path(__file__).resolve().parents[1]
SLOW = ("sm90a", "moe_sm90a")  # CUTLASS 3.x collectives: a minute or more each


def named_kernels(profile: dict, families) -> dict:
    """kernel name -> the entries (short labels) whose schedule compiles to it."""
    out = defaultdict(list)
    for section in ("entries", "grouped"):
        for e in profile.get(section, []):
            cfg = parse_schedule(e["schedule"], dtype=e["dtype"], bits=e["bits"], zero_mode=e["zero_mode"])
            if cfg.family not in families:
                continue
            where = f"m={e['m']}" if "m" in e else f"T={e['tokens']} {e['stage']}"
            out[cfg.kernel_name].append(f"{e['dtype']} u{e['bits']} {e['n']}x{e['k']} {where}")
    return out


def ptxas(tree: Path, name: str):
    """(registers, spill store bytes) of ``name`` built from ``tree``, None where that tree lacks its
    source, or why the build failed."""
    src = tree / "generated" / f"{name}.cu"
    if not src.is_file():
        return None
    try:
        return ptxas_usage(src, templates=tree / "templates")
    except BuildError as exc:
        return f"build failed: {str(exc).splitlines()[0][:120]}"


def figures(r) -> str:
    if r is None:
        return "-"
    return r if isinstance(r, str) else f"{r[0]} regs, {r[1]} B spilled"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. the profile's sweep)")
    ap.add_argument("--profile", default=str(ROOT / "profiles" / "h100.json"))
    ap.add_argument("--families", default="gemv,sm80,sm90s,moe_gemv,moe_sm80,moe_sm90s,dequant_mm")
    ap.add_argument("--jobs", type=int, default=2, help="nvcc processes at once")
    args = ap.parse_args(argv)
    kernels = named_kernels(json.loads(Path(args.profile).read_text()), set(args.families.split(",")))
    print(f"{len(kernels)} kernels named by {args.profile}; comparing with {args.base}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            with ThreadPoolExecutor(args.jobs) as pool:
                now = dict(zip(kernels, pool.map(lambda n: ptxas(ROOT, n), kernels)))
                then = dict(zip(kernels, pool.map(lambda n: ptxas(base, n), kernels)))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    absent = [n for n in kernels if then[n] is None]  # added since the base: nothing to compare
    changed = [n for n in sorted(kernels) if then[n] is not None and now[n] != then[n]]
    for n in changed:
        print(f"{n}: {figures(then[n])} -> {figures(now[n])}; entries: {', '.join(kernels[n][:6])}"
              f"{' ...' if len(kernels[n]) > 6 else ''}")
    print(f"{len(changed)} of {len(kernels) - len(absent)} kernels changed ({len(absent)} added since {args.base})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
