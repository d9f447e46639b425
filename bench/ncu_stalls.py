"""Where a kernel's warps spend their time, from Nsight Compute's per-instruction samples.

    ncu --clock-control none --kernel-name regex:mg_ --launch-skip 3 --launch-count 1 \\
        --section SourceCounters -o rep python3 bench/ncu_case.py SCHEDULE --n 4096 --k 4096 --m 256
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python bench/ncu_stalls.py rep.csv [other.csv ...]

For each report: the warp-state samples by stall reason, then the code cut into runs of
consecutive instructions that ran the same number of times. A run's count says what it is: once a
warp (prologue, epilogue), once a k-tile (the main loop), once a ring slot (the producer). Each run
shows its instruction count, its share of the samples and its top stall reasons, so two kernels'
prologue, loop and epilogue can be set side by side (docs/notes/serving-mainloop.md, "The epilogue:
two rows per store", came from this).
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter
from dataclasses import dataclass, field
from typing import List, Tuple

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Run:
    first: str
    last: str
    executed: int
    instructions: int = 0
    samples: int = 0
    reasons: Counter = field(default_factory=Counter)
    hottest: Tuple[int, str] = (0, "")


def load(path: str) -> Tuple[str, List[dict]]:
    """(kernel name, one dict per SASS instruction) from ``ncu --page source --csv``."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or not rows[0] or rows[0][0] != "Kernel Name":
        raise ValueError(f"{path}: not an `ncu --page source --csv` export (first cell {rows[0][:1] if rows else []})")
    header = rows[1]
    for column in ("Address", "Source", SAMPLES, EXECUTED):
        if column not in header:
            raise ValueError(f"{path}: no column {column!r} (profile with --section SourceCounters)")
    return rows[0][1], [dict(zip(header, r)) for r in rows[2:] if len(r) == len(header)]


def _int(v: str) -> int:
    return int(v) if v and v.strip().lstrip("-").isdigit() else 0


def reasons_of(row: dict) -> Counter:
    return Counter({k[len("stall_"):]: _int(v) for k, v in row.items()
                    if k.startswith("stall_") and "(Not" not in k and _int(v)})


def runs(rows: List[dict]) -> List[Run]:
    """Consecutive instructions with the same execution count, in address order."""
    out: List[Run] = []
    for row in rows:
        executed, samples = _int(row[EXECUTED]), _int(row[SAMPLES])
        if not out or out[-1].executed != executed:
            out.append(Run(row["Address"], row["Address"], executed))
        run = out[-1]
        run.last = row["Address"]
        run.instructions += 1
        run.samples += samples
        run.reasons.update(reasons_of(row))
        if samples > run.hottest[0]:
            run.hottest = (samples, row["Source"].strip())
    return out


def report(path: str, min_share: float = 0.01) -> str:
    name, rows = load(path)
    parts = runs(rows)
    total = sum(run.samples for run in parts) or 1
    reasons = sum((run.reasons for run in parts), Counter())
    lines = [f"== {name}: {total} samples, {sum(run.executed * run.instructions for run in parts)} warp instructions",
             "   reasons: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in reasons.most_common(8))]
    for run in parts:
        if run.samples / total < min_share:
            continue
        top = ", ".join(f"{k} {v}" for k, v in run.reasons.most_common(3))
        lines.append(f"   x{run.executed:<7d} {run.instructions:5d} instr {100 * run.samples / total:5.1f}% "
                     f"[{top}]  hottest: {run.hottest[1][:60]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="`ncu -i REPORT --page source --csv --print-source sass` output")
    ap.add_argument("--min-share", type=float, default=0.01, help="hide runs with fewer samples than this share")
    a = ap.parse_args()
    for path in a.csv:
        print(report(path, a.min_share))


if __name__ == "__main__":
    main()
