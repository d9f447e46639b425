"""Run by tests/ops/test_packaged_gpu.py in a fresh process with ``MIXED_GEMM_JIT=off``, an empty
kernel cache and neither nvcc nor the CUTLASS headers reachable: every kernel selection picks for
the eight Llama-3 8B/70B shapes at M = 1 ... 4096, fp16 and bf16, int4/int8 (g128) and the
low-bit kinds (2, 3 bits and 1:2-sparse 7 bits, g64), and the MoE layers of two presets at 1 to
4096 tokens (both grouped families), must come from the installed kernel package, and each result
must match the float32 reference element-wise. Prints one line per weight and
``packaged: N passed`` last; any compile attempt raises JitDisabledError and fails the run."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tolerance.py
sys.modules["cutlass_library"] = None  # the CUTLASS headers are unreachable too (import fails)

import mixed_gemm as mg  # noqa: E402
from tolerance import assert_elementwise  # noqa: E402

SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
          (57344, 8192), (8192, 28672))
KINDS = ((4, 128), (8, 128), (2, 64), (3, 64), (7, 64))  # (bits, group)
MS = tuple(1 << i for i in range(13))  # 1 .. 4096
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def weight(n, k, bits, group, dtype, gen):
    if bits == 7:  # 1:2-sparse: the pattern comes from sparsify_quantize
        q, s, z = mg.sparsify_quantize(torch.randn(n, k, device="cuda", generator=gen), group_size=group)
        s = s * (2.0 / k**0.5)
    else:
        q = torch.randint(0, 2**bits, (n, k), device="cuda", generator=gen, dtype=torch.uint8)
        s = (torch.rand(n, k // group, device="cuda", generator=gen) + 0.5) * (2.0 / (2**bits * k**0.5))
        z = torch.randint(0, 2**bits, (n, k // group), device="cuda", generator=gen).float()
    s, z = s.to(dtype), z.to(dtype)
    w = mg.prepack(q, s, z, format="plain", bits=bits, group_size=group, zero_mode="int", dtype=dtype)
    dense = mg.reference.dequantize(q, s, z, group_size=group, bits=bits).float()
    return w, dense


def readme_api(gen) -> None:
    """The README's API block on random inputs, each result against the float32 reference of the
    canonical codes. Its `config=` line names an sm80 kernel, which cannot read the sm90a weight an
    H100 gets: that must raise the clear ValueError naming the config (or, for a kernel the
    package lacks, JitDisabledError); running anything instead fails the check."""
    n, k, g = 4096, 4096, 128
    w16 = torch.randn(n, k, device="cuda", generator=gen).half() / k**0.5
    q, s, z = mg.quantize(w16, bits=4, group_size=g)
    qweight, scales, qzeros = mg.pack(q, s, z, format="awq", bits=4, group_size=g)
    dense = mg.reference.dequantize(q, s, z, group_size=g, bits=4).float()
    for m in (1, 16, 300):
        x = torch.randn(m, k, device="cuda", generator=gen).half()
        ref = x.float() @ dense.t()
        w = mg.prepack(qweight, scales, qzeros, format="awq", bits=4, group_size=g)
        assert w.layout == "sm90a", w.layout
        assert_elementwise(mg.matmul(x, w), ref, k)
        assert_elementwise(mg.matmul(x, qweight, scales, qzeros, format="awq"), ref, k)
        print(f"README API M={m}: {mg.explain(x, w)}")
    qw, sc, qz = mg.pack(q, s, z, format="gptq", bits=4, group_size=g)
    g_idx = torch.arange(k, device="cuda") // g
    wb = mg.prepack(qw, sc.bfloat16(), qz, format="gptq", g_idx=g_idx, bits=4, group_size=g, dtype=torch.bfloat16)
    x = torch.randn(16, k, device="cuda", generator=gen).bfloat16()
    dense_bf16 = mg.reference.dequantize(q, s.bfloat16(), z, group_size=g, bits=4)
    assert_elementwise(mg.matmul(x, wb), x.float() @ dense_bf16.t(), k)
    wo = mg.prepack(q, s, -z * s, format="plain", zero_mode="offset", bits=4, group_size=g)
    assert_elementwise(mg.dequantize(wo), dense, 1)
    try:
        mg.matmul(x.half(), w, config=mg.KernelConfig(tile=(16, 64, 128), warps=(1, 1, 4),
                                                     split_k_mode="parallel", split_k=4, swizzle=2))
    except mg.compile.JitDisabledError as exc:
        print(f"README API config= line: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    except ValueError as exc:
        assert "cannot run this problem" in str(exc), exc
        print(f"README API config= line: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    else:
        raise AssertionError("README API config= line: an sm80 config ran on an sm90a weight with JIT off; "
                             "expected a ValueError naming the config, or JitDisabledError")
    from mixed_gemm.nn import QuantLinear

    linear = torch.nn.Linear(k, n, bias=True).cuda().half()
    layer = QuantLinear.from_linear(linear, bits=4, group_size=g)
    xl = torch.randn(4, k, device="cuda", generator=gen).half()
    ql, sl, zl = mg.quantize(linear.weight.detach(), bits=4, group_size=g)
    ref = mg.reference.matmul(xl, ql, sl, zl, group_size=g, bits=4, bias=linear.bias.detach())
    assert_elementwise(layer(xl), ref, k)
    torch.cuda.synchronize()


# MoE presets (E, top_k, H, I): Qwen3-30B-A3B and DeepSeek-V2-Lite at full size; the tokens span both
# grouped families (moe_gemv below ~8 routed rows per expert, moe_sm90a above).
MOE_PRESETS = ((128, 8, 2048, 768), (64, 6, 2048, 1408))
MOE_TOKENS = (1, 16, 256, 4096)


def moe_layers(gen) -> int:
    """mg.moe from the package (JIT off) against mg.reference.moe, fp16 int4 g128 with zeros."""
    from mixed_gemm.ops.moe_grouped import grouped_plan

    checked = 0
    for e, top_k, h, inter in MOE_PRESETS:
        ws, dense = [], []
        for n, k in ((2 * inter, h), (h, inter)):
            q = torch.randint(0, 16, (e, n, k), device="cuda", generator=gen, dtype=torch.uint8)
            s = ((torch.rand(e, n, k // 128, device="cuda", generator=gen) + 0.5) * (2.0 / (16 * k**0.5))).half()
            z = torch.randint(0, 16, (e, n, k // 128), device="cuda", generator=gen).half()
            ws.append(mg.prepack_experts(q, s, z, group_size=128, dtype=torch.float16, gate_up=n == 2 * inter))
            dense.append(torch.stack([mg.reference.dequantize(q[i], s[i], z[i], group_size=128, bits=4).float()
                                      for i in range(e)]))
        for t in MOE_TOKENS:
            x = torch.randn(t, h, device="cuda", generator=gen).half()
            scores = torch.randn(t, e, device="cuda", generator=gen).softmax(-1)
            weights, ids = scores.topk(top_k, dim=1)
            y = mg.moe(x, ws[0], ws[1], weights, ids)
            assert_elementwise(y, mg.reference.moe(x.float(), dense[0], dense[1], weights.float(), ids), inter,
                               chained=3)
            print(f"MoE E={e} top-{top_k} {h}x{inter} T={t}: ok ({grouped_plan(x, ws[0], ws[1], top_k)!r})", flush=True)
            checked += 1
    return checked


def main() -> int:
    assert mg.jit_mode() == "off", "run with MIXED_GEMM_JIT=off"
    tools, missing = mg.compile.toolchain()
    assert tools is None, f"nvcc and CUTLASS must be unreachable here, found {tools}"
    print("toolchain:", missing.splitlines()[0])
    print("kernel packages:", *mg.compile.packages.summary(), sep="\n  ")
    gen = torch.Generator(device="cuda").manual_seed(20261124)
    readme_api(gen)
    passed = 0
    for dname, dtype in DTYPES.items():
        for bits, group in KINDS:
            for n, k in SHAPES:
                start = time.perf_counter()
                w, dense = weight(n, k, bits, group, dtype, gen)
                families = set()
                for m in MS:
                    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                    mg.matmul(x, w, out=out)
                    ref = x.float() @ dense.t()
                    assert not out.isnan().any(), f"{dname} {bits}-bit {n}x{k} M={m}: unwritten output"
                    assert_elementwise(out, ref, k)
                    families.add(mg.explain(m, w).family.name)
                    passed += 1
                del w, dense
                print(f"{dname} {bits}-bit g{group} {n}x{k}: M 1..4096 ok ({'/'.join(sorted(families))}), "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
    passed += moe_layers(gen)
    assert not mg.pending_builds(), mg.pending_builds()
    print(f"packaged: {passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
