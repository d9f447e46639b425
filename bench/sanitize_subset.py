"""A representative subset of kernels for compute-sanitizer (memcheck, racecheck), small shapes.

    compute-sanitizer --tool memcheck python bench/sanitize_subset.py
Covers: the decode tile (K-warp reduction in shared memory), a prefill tile, serial and parallel
split-K with swizzle, bf16 int8 with offsets, ragged N/K, act-order, and the dequantize kernel.
Exits non-zero if a result disagrees with the reference.
"""
import sys

import torch

import mixed_gemm as mg

CASES = [  # (dtype, bits, zero_mode, tile, warps, stages, split mode, split, swizzle, m, n, k, group)
    ("f16", 4, "int", (16, 64, 128), (1, 1, 4), 4, "none", 1, 1, 3, 200, 320, 64),
    ("f16", 4, "int", (16, 64, 128), (1, 1, 4), 4, "serial", 3, 2, 1, 136, 512, 128),
    ("f16", 8, "sym", (128, 128, 64), (2, 2, 1), 4, "parallel", 2, 4, 130, 264, 256, 32),
    ("bf16", 8, "offset", (16, 128, 128), (1, 2, 2), 4, "serial", 2, 1, 5, 128, 384, -1),
    ("bf16", 4, "float", (128, 256, 64), (2, 4, 1), 3, "none", 1, 8, 70, 520, 192, 64),
    ("f16", 4, "int", (16, 64, 128), (1, 1, 4), 6, "fused", 4, 2, 3, 200, 1024, 128),
    ("f16", 4, "int", (64, 64, 128), (2, 1, 2), 4, "fused", 3, 1, 70, 328, 768, 64),
]


def main() -> int:
    torch.manual_seed(0)
    bad = 0
    for dtype, bits, zero, tile, warps, stages, mode, split, sw, m, n, k, g in CASES:
        td = torch.float16 if dtype == "f16" else torch.bfloat16
        groups = 1 if g == -1 else k // g
        q = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device="cuda")
        s = ((torch.rand(n, groups, device="cuda") + 0.5) * 0.02).to(td)
        z = {"sym": None, "int": torch.randint(0, 2**bits, (n, groups), device="cuda").to(td),
             "float": (torch.rand(n, groups, device="cuda") * 15).to(td),
             "offset": (-torch.rand(n, groups, device="cuda") * 0.1).to(td)}[zero]
        w = mg.prepack(q, s, z, format="plain", bits=bits, group_size=g, dtype=td,
                       zero_mode="int" if zero in ("sym", "int") else zero)
        cfg = mg.KernelConfig(dtype=dtype, bits=bits, zero_mode=w.zero_mode, tile=tile, warps=warps, stages=stages,
                              split_k_mode=mode, split_k=split, swizzle=sw)
        x = torch.randn(m, k, device="cuda").to(td)
        y = mg.matmul(x, w, config=cfg)
        ref = mg.reference.matmul(x, q, s, z, group_size=g, bits=bits, zero_mode="offset" if zero == "offset" else "int")
        err = ((y.float() - ref).norm() / ref.norm()).item()
        dq = mg.dequantize(w)
        torch.cuda.synchronize()
        ok = err < (2e-3 if dtype == "f16" else 1e-2) and bool(torch.isfinite(dq).all())
        bad += not ok
        print(f"{cfg.name}: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
