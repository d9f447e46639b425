"""Which entries of a shipped profile selection passes over for a weight packed the default way.

    python bench/profile_audit.py profiles/h100.json [--capability 9.0] [--sms 132]

For every own entry (shape, M bucket) of the profile, selection is asked (no GPU: the given
compute capability and SM count) what it runs for a weight in the layout ``prepack(layout="auto")``
gives on that GPU (sm90a on Hopper, sm80 before it, lowbit for the 1-3-bit and 1:2-sparse widths):
``mixed_gemm.select.coverage.passed_over``. An entry whose schedule reads another layout is passed
over; selection then borrows the nearest shape's entry or falls to the heuristics, so the default
path runs something nobody measured on that shape (docs/notes/gemv.md, "One-shot mode").
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mixed_gemm.kernels import layout_on
from mixed_gemm.select.coverage import passed_over
from mixed_gemm.select.profiles import Profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--capability", default="9.0", help="compute capability selection judges for (9.0: Hopper)")
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    capability = tuple(int(v) for v in a.capability.split("."))
    profile = Profile.load(a.profile)
    rows = passed_over(profile, capability, a.sms)
    total = len(Profile.load(a.profile, with_base=False).entries)
    print(f"{a.profile}: {total - len(rows)} of {total} entries run as measured; {len(rows)} passed over for a "
          f"default ({layout_on(capability, 4)}) weight")
    for entry, runs, source in rows:
        print(f"  {entry['dtype']} u{entry['bits']} {entry['n']}x{entry['k']} M={entry['m']:<5d} "
              f"{entry['schedule']:42s} -> {runs} ({source})")


if __name__ == "__main__":
    main()
