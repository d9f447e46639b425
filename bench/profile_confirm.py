"""Confirm a profile sweep on the GPU the profile is for, before it ships: every entry whose
schedule the sweep changed (SWEPT against SHIPPED) is timed against the shipped schedule,
alternated over --rounds rounds (bench/schedule_ab.py's timing: cold L2, CUDA graphs, medians),
and OUT gets SHIPPED with only the changes that won by more than --margin
(mixed_gemm/profiler/confirm.py).

    python bench/profile_confirm.py --shipped profiles/h100.json --swept $OUT/h100.json \\
        --out $OUT/h100-confirmed.json [--rounds 4] [--margin 0.01]

Why: a sweep times each candidate once, so small wins may be noise; a sweep run on an H200 for the
H100's profile favours what the H200's bandwidth favours (2026-11-28: of 14 fp16 changes an H200
sweep made, 3 won on the H100). Changes of a zero mode other than ``int`` are listed and left out
(the A/B times weights with integer zeros).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from schedule_ab import time_cases  # noqa: E402

from mixed_gemm.profiler.confirm import MARGIN, changes, confirmed  # noqa: E402
from mixed_gemm.select.profiles import Profile  # noqa: E402


def main() -> None:
    summary, details = __doc__.split("\n\n", 1)
    ap = argparse.ArgumentParser(description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shipped", required=True, help="the profile in use (e.g. profiles/h100.json)")
    ap.add_argument("--swept", required=True, help="the same profile after a sweep merged into it")
    ap.add_argument("--out", required=True, help="where the confirmed profile goes")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--margin", type=float, default=MARGIN, help="the share a change must win by (default 0.01)")
    a = ap.parse_args()
    shipped = Profile.load(Path(a.shipped), with_base=False)
    found, added = changes(shipped, Profile.load(Path(a.swept), with_base=False))
    for label in added:
        print(f"{label}: not in the shipped profile, left out")
    timed = {}
    for dtype in ("f16", "bf16"):
        mine = [c for c in found if c.key[0] == dtype and c.key[2] == "int"]
        cases = [(c.key[4], c.key[5], c.m, c.key[1], c.key[3], [c.old, c.new]) for c in mine]
        medians = {}
        if cases:
            time_cases(cases, dtype, a.rounds, False, medians)
        for c in mine:
            at = (c.key[4], c.key[5], c.m, c.key[1], c.key[3])
            timed[c] = (medians[at + (c.old,)], medians[at + (c.new,)])
    for c in found:
        if c not in timed:
            print(f"{c.label}: zero mode {c.key[2]} is not timed here, left out")
    profile, lines = confirmed(shipped, timed, a.margin)
    print("\n".join(lines))
    profile.save(Path(a.out))
    print(f"{sum(line.endswith('taken') for line in lines)} of {len(found)} changes taken -> {a.out}")


if __name__ == "__main__":
    main()
