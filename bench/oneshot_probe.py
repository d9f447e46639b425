"""The one-shot dense decode probe (bench/oneshot_probe.cu; docs/notes/gemv.md, "A one-shot dense
decode probe") against what ``mg.matmul`` selects and cuBLAS fp16, on the shapes whose share fits one
CTA's shared memory on 132 SMs (8B qkv 6144x4096 and o 4096x4096), at 1, 8 and 16 tokens: int4
g128 integer zeros, fp16. The probe is built here with nvcc (sm_90a), checked element-wise against
``mg.matmul``'s output, then all three are timed with ``profiler.timing.time_cold`` (cold L2, CUDA
graphs, alternating, median). A question, not a kernel: the answer decides whether the gemv and
sm90s families get a one-shot mode for their small shapes.

    python bench/oneshot_probe.py --out $OUT/oneshot-probe.md
"""
from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import mixed_gemm as mg
from mixed_gemm.kernels.base import sm_count
from mixed_gemm.profiler.timing import time_cold
from mixed_gemm.profiler.workload import random_weights

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((4096, 4096), (6144, 4096))
MAX_SMEM = 227 * 1024


def build(out_dir: Path) -> ctypes.CDLL:
    import cutlass_library

    lib = out_dir / "oneshot_probe.so"
    include = Path(cutlass_library.source_path) / "include"
    subprocess.run(["nvcc", "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90a",
                    "--expt-relaxed-constexpr", "-DNDEBUG", f"-I{include}", f"-I{ROOT / 'templates'}",
                    str(ROOT / "bench" / "oneshot_probe.cu"), "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))
    so.probe_smem_bytes.argtypes = [ctypes.c_int] * 3
    so.probe_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    return so


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,8,16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", help="write the table here too")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("oneshot_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    so = build(Path(tempfile.mkdtemp()))
    sms = sm_count(0)
    rows = [f"{torch.cuda.get_device_name()}, {sms} SMs; µs per call, cold L2, CUDA graphs (median of {args.rounds})",
            "", "| shape | M | probe | mg.matmul | cuBLAS fp16 | probe / mg | max err vs mg |", "|---|---|---|---|---|---|---|"]
    for n, k in SHAPES:
        w = random_weights(n, k, layout="sm90a")[0]
        dense = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        units = n // 16
        per = -(-units // sms)
        grid = -(-units // per)
        katoms, groups = w.b.shape[0], w.scales.shape[0]
        shift = (k if w.group_size == -1 else w.group_size).bit_length() - 1
        smem = so.probe_smem_bytes(per, katoms, groups)
        if smem > MAX_SMEM:
            rows.append(f"| {n}x{k} | - | {smem} B of shared memory: does not fit | | | | |")
            continue
        for m in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)

            def probe():
                err = so.probe_launch(w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr(), x.data_ptr(),
                                      y.data_ptr(), m, n, k, katoms, groups, shift, grid, per,
                                      torch.cuda.current_stream().cuda_stream)
                if err:
                    raise RuntimeError(f"probe_launch: CUDA error {err}")
                return y
            ref = mg.matmul(x, w)
            probe()
            torch.cuda.synchronize()
            err = (y.float() - ref.float()).abs().max().item() / max(1e-6, ref.float().abs().max().item())
            timed = time_cold({"probe": probe, "mg": lambda: mg.matmul(x, w), "fp16": lambda: x @ dense.t()},
                              args.rounds, eager=False)
            us = {key: secs * 1e6 for key, (secs, _) in timed.items()}
            rows.append(f"| {n}x{k} | {m} | {us['probe']:.2f} | {us['mg']:.2f} | {us['fp16']:.2f} | "
                        f"{us['probe'] / us['mg']:.2f} | {err:.1e} |")
            print(rows[-1], flush=True)
    text = "\n".join(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
