"""Instructions per weight atom in a decode kernel's main loop, from its SASS (sm_90, cuobjdump).

    python bench/sass_count.py gemv:m8_s4_w2x2_u8 --bits 2 [--dtype f16] [--group 64]
    python bench/sass_count.py sm80:t16x128x128_w1x2x2_s4_lowbit --bits 2

Builds (or finds in the kernel cache) the schedule's compiled identity, takes the SASS of its
kernel and counts the instructions of the innermost loop body that holds the most HMMAs (the main
loop the group size selects: with group 64 and a u8 step, the per-group variant). Per atom = the
loop's instructions / the HMMAs that consume a weight atom in one pass (strips x unroll x tiles):
the figure to compare before and after a change to a decode kernel's inner loop.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys

from mixed_gemm.compile.cache import build_spec
from mixed_gemm.kernels import split_schedule

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def sass_lines(fatbin: str):
    text = subprocess.run(["cuobjdump", "-sass", "-arch", "sm_90", fatbin], capture_output=True, text=True,
                          check=True).stdout
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def loops(lines):
    """(start, end) address ranges of backward branches: BRA to an earlier address."""
    found = []
    for addr, op, rest in lines:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", rest)
            if m and int(m.group(1), 16) < addr:
                found.append((int(m.group(1), 16), addr))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("schedule")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--zero-mode", default="int")
    args = ap.parse_args(argv)
    fam, sched = split_schedule(args.schedule)
    cfg = fam.from_schedule(sched, dtype=args.dtype, bits=args.bits, zero_mode=args.zero_mode)
    binary = build_spec(fam.build_spec(cfg))
    lines = sass_lines(str(binary))
    best = None
    for lo, hi in loops(lines):
        body = [op for a, op, _ in lines if lo <= a <= hi]
        hmma = sum(op.startswith("HMMA") for op in body)
        if best is None or hmma > best[0] or (hmma == best[0] and len(body) < len(best[1])):
            best = (hmma, body, lo, hi)
    if best is None or best[0] == 0:
        print("no loop with HMMA found", file=sys.stderr)
        return 1
    hmma, body, lo, hi = best
    if cfg.family == "sm80":  # an atom (16 n x 16 k) is 2 HMMA (n8 tiles) per m16 tile of the warp
        tiles = 2 * (cfg.tile[0] // cfg.warps[0] // 16)
    else:
        tiles = max(1, cfg.tokens // 8) if not cfg.fma else 1
    # `_ds`: one more mma per atom and n8 tile for the sums, shared by the warp's strips
    shared = 1 + 1 / cfg.strips if getattr(cfg, "deferred", False) else 1
    # 1:2-sparse: one mma.sp (HMMA.SP.16832) takes two atoms (k32)
    atoms = round(hmma / tiles / shared * (2 if cfg.bits == 7 and cfg.family == "gemv" else 1))
    kinds = collections.Counter(op.split(".")[0] for op in body)
    print(f"{cfg.kernel_name}: loop {lo:#x}-{hi:#x}, {len(body)} instructions, {hmma} HMMA, "
          f"{atoms} atoms -> {len(body) / atoms:.1f} per atom")
    print("  " + " ".join(f"{k}:{v}" for k, v in kinds.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
