"""Instructions per weight atom in a decode kernel's main loop, from its SASS (sm_90), and with
--prologue what a kernel runs before its first global load.

    python bench/sass_count.py gemv:m8_s4_w2x2_u8 --bits 2 [--dtype f16] [--group 64]
    python bench/sass_count.py sm80:t16x128x128_w1x2x2_s4_lowbit --bits 2
    python bench/sass_count.py moe_gemv:w2_s1_w1x16_u8_ds_sw --prologue

The SASS comes from cuobjdump on the cached fatbin, or where the CUDA toolkit has no cuobjdump (the
pip-installed nvcc of the build machines) from nvdisasm on a cubin compiled for the family's
architecture: nvdisasm from $NVDISASM, PATH, or NVIDIA's ``nvidia-cuda-nvdisasm`` wheel.

Builds (or finds in the kernel cache) the schedule's compiled identity, takes the SASS of its
kernel and counts the instructions of the innermost loop body that holds the most HMMAs (the main
loop the group size selects: with group 64 and a u8 step, the per-group variant). Per atom = the
loop's instructions / the HMMAs that consume a weight atom in one pass (strips x unroll x tiles):
the figure to compare before and after a change to a decode kernel's inner loop.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mixed_gemm.compile.cache import build_spec
from mixed_gemm.compile.nvcc import compile_cubin
from mixed_gemm.kernels import split_schedule

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def _nvdisasm():
    """nvdisasm: $NVDISASM, PATH, or the nvidia-cuda-nvdisasm wheel's binary; None without one."""
    found = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # the namespace package NVIDIA's CUDA wheels install into
    except ImportError:
        return None
    hits = [p for root in nvidia.__path__ for p in Path(root).glob("cu*/bin/nvdisasm")]
    return str(hits[0]) if hits else None


def _arch(arch_flags) -> str:
    """The highest real architecture a family builds for (``code=sm_90a`` -> ``sm_90a``)."""
    codes = [m.group(1) for f in arch_flags for m in [re.search(r"code=(sm_\d+a?)", f)] if m]
    return max(codes, key=lambda c: (int(re.sub(r"\D", "", c)), c)) if codes else "sm_90"


def sass_text(binary: Path, arch_flags) -> str:
    """The SASS of the kernel built at ``binary`` (its source beside it) for the family's architecture."""
    arch = _arch(arch_flags)
    if shutil.which("cuobjdump"):
        return subprocess.run(["cuobjdump", "-sass", "-arch", arch, str(binary)], capture_output=True, text=True,
                              check=True).stdout
    tool = _nvdisasm()
    if tool is None:
        raise SystemExit("no cuobjdump and no nvdisasm: set NVDISASM or pip install nvidia-cuda-nvdisasm")
    source = next(binary.parent.glob("*.cu"))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = compile_cubin(source, Path(tmp) / "k.cubin", arch=arch)
        return subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def sass_lines(text: str):
    """``(address, opcode, operands)`` per instruction; nvdisasm's branch labels (``.L_x_6``) become
    the addresses they stand for, as cuobjdump prints them."""
    out, labels, pending = [], {}, []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _LINE.search(line)
        if m:
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            out.append((addr, m.group(3), m.group(4)))
    if labels:
        out = [(a, op, re.sub(r"\.L_x_\d+", lambda m: f"{labels.get(m.group(0), 0):#x}", rest)) for a, op, rest in out]
    return out


_GLOBAL_LOAD = re.compile(r"^(LDG|LD)(\.|$)")
_CONSTANT = re.compile(r"c\[0x0\]\[(0x[0-9a-f]+)\]")


def prologue(lines) -> str:
    """What stands before the first global load (LDG, or LD, a generic load) in address order:
    instructions, and the 64-byte lines of the parameter bank (c[0x0]) they read, each line's first
    read a constant-cache miss on an SM that has not run the kernel yet. Address order is ptxas's
    layout, not a path: a branch the launch skips (moe_gemv's PDL prefetch) counts when laid out first."""
    for i, (addr, op, rest) in enumerate(lines):
        if _GLOBAL_LOAD.match(op):
            break
    else:
        return "no global load"
    before = lines[:i]
    offsets = [int(m, 16) for _, _, rest in before for m in _CONSTANT.findall(rest)]
    first = {}
    for o in offsets:
        first.setdefault(o // 64, o)
    kinds = collections.Counter(op.split(".")[0] for _, op, _ in before)
    return (f"{len(before)} instructions to the first global load ({op} at {addr:#x}); parameter-bank "
            f"lines read before it, in order of first use: {' '.join(f'{64 * k:#x}' for k in first)}\n  "
            + " ".join(f"{k}:{v}" for k, v in kinds.most_common(12)))


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
    ap.add_argument("--prologue", action="store_true", help="count what runs before the first global load instead")
    args = ap.parse_args(argv)
    fam, sched = split_schedule(args.schedule)
    cfg = fam.from_schedule(sched, dtype=args.dtype, bits=args.bits, zero_mode=args.zero_mode)
    spec = fam.build_spec(cfg)
    lines = sass_lines(sass_text(build_spec(spec), spec.arch_flags))
    if args.prologue:
        print(f"{cfg.kernel_name}: {prologue(lines)}")
        return 0
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
