"""How close selection gets on shapes no profile holds (the aim: within 1.25x of the best).

Reads the CSV of a ``mixed-gemm profile --shapes ... --no-merge`` sweep of held-out shapes (every
candidate timed on the GPU; the H100's is ``profiles/h100-heldout-f16.csv.gz``) and, for each
(shape, M), asks selection what it would run on that GPU with the shipped profile (nearest
profiled shape, refitted) or the heuristics; prints that schedule's time over the sweep's best.
Runs on the CPU (selection for compute capability 9.0 and the SM count given); a schedule the
sweep did not time is listed, to time with ``mixed-gemm profile --shapes N:K --ms M --schedules``.

    python bench/heldout_check.py [--csv profiles/h100-heldout-f16.csv.gz] [--profile profiles/h100.json]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mixed_gemm.kernels import Problem  # noqa: E402
from mixed_gemm.select import Profile  # noqa: E402
from mixed_gemm.select.selection import choose  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default="profiles/h100-heldout-f16.csv.gz")
    ap.add_argument("--profile", default="profiles/h100.json")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    times = defaultdict(dict)  # (n, k, m) -> schedule -> µs
    for row in csv.DictReader(gzip.open(args.csv, "rt") if args.csv.endswith(".gz") else open(args.csv)):
        if row["Status"] == "success" and row["Runtime"]:
            times[(int(row["n"]), int(row["k"]), int(row["m"]))][row["schedule"]] = float(row["Runtime"]) * 1e3
    profile = Profile.load(Path(args.profile))
    shapes = sorted({(n, k) for n, k, _ in times})
    ms = sorted({m for _, _, m in times})
    lines = ["| shape | " + " | ".join(f"M={m}" for m in ms) + " |", "|---" * (len(ms) + 1) + "|"]
    worst, untimed = 0.0, []
    for n, k in shapes:
        cells = []
        for m in ms:
            sweep = times.get((n, k, m), {})
            problem = Problem(m=m, n=n, k=k, dtype=args.dtype, bits=args.bits, zero_mode="int", group_size=128,
                              layout="sm90a")
            choice = choose(problem, 0, capability=(9, 0), sms=args.sms, profile=profile, override=False)
            if not sweep or choice.schedule not in sweep:
                cells.append(f"{choice.schedule} (untimed)")
                untimed.append(f"--shapes {n}:{k} --ms {m} --schedules {choice.schedule},{min(sweep, key=sweep.get)}")
                continue
            ratio = sweep[choice.schedule] / min(sweep.values())
            worst = max(worst, ratio)
            cells.append(f"{ratio:.2f}")
        lines.append(f"| {n}x{k} | " + " | ".join(cells) + " |")
    lines.append(f"\nworst: {worst:.2f} (selection's schedule / the sweep's best)")
    lines += [f"untimed: mixed-gemm profile {u} --no-merge" for u in untimed]
    text = "\n".join(lines)
    print(text)
    if args.out:
        open(args.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
