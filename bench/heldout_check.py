"""How close selection gets on shapes no profile holds (issue #23 item 4: within 25% of the best).

Reads the CSV of a ``mixed-gemm profile --shapes ... --no-merge`` sweep of held-out shapes (every
candidate timed) and, for each (shape, M), asks ``mg.explain`` what the shipped profile (nearest
profiled shape) or the heuristics would run; prints that schedule's time over the sweep's best.
Run on the GPU after the sweep: ``python bench/heldout_check.py --csv heldout.csv [--dtype bf16 --bits 8]``.
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict

import mixed_gemm as mg
from mixed_gemm.profiler.workload import random_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    times = defaultdict(dict)  # (n, k, m) -> schedule -> µs
    for row in csv.DictReader(open(args.csv)):
        if row["Status"] == "success" and row["Runtime"]:
            times[(int(row["n"]), int(row["k"]), int(row["m"]))][row["schedule"]] = float(row["Runtime"]) * 1e3
    shapes = sorted({(n, k) for n, k, _ in times})
    ms = sorted({m for _, _, m in times})
    lines = ["| shape | " + " | ".join(f"M={m}" for m in ms) + " |", "|---" * (len(ms) + 1) + "|"]
    worst = 0.0
    for n, k in shapes:
        w = random_weights(n, k, bits=args.bits, dtype=args.dtype)[0]
        cells = []
        for m in ms:
            sweep = times.get((n, k, m), {})
            choice = mg.explain(m, w)
            if not sweep or choice.schedule not in sweep:
                cells.append(f"{choice.schedule} (untimed)")
                continue
            ratio = sweep[choice.schedule] / min(sweep.values())
            worst = max(worst, ratio)
            cells.append(f"{ratio:.2f}")
        lines.append(f"| {n}x{k} | " + " | ".join(cells) + " |")
    lines.append(f"\nworst: {worst:.2f} (selection's schedule / the sweep's best)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        open(args.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
