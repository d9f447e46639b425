"""``matmul(..., residual=)`` on the GPU: the skip connection added in the decode families'
epilogues (every gemv catalog shape, every sm80 split-K mode on both layouts) and after the GEMM
for the others (sm90a, dequant_mm), element-wise against the float32 reference plus the residual;
with bias, graph capture, the custom op under torch.compile, and the rules checked before any launch."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import family, parse_schedule, sm80
from mixed_gemm.kernels.gemv.catalog import shapes_for
from mixed_gemm.kernels.gemv.config import GemvConfig
from mixed_gemm.nn import QuantLinear
from test_gemv_gpu import _weight
from test_sm90a_gpu import DTYPES, TOL, ZERO_KINDS
from weights import rel_err, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GROUPS = (32, 64, 128, -1)
SM80_LAUNCH = (("none", 1), ("fused", 3), ("parallel", 2), ("serial", 3))


def _params():
    rng = random.Random(2525)
    cases = []  # (qualified schedule, dtype, bits, layout, m)
    for bits in (4, 8):
        for i, shape in enumerate(shapes_for(bits)):
            dtype = ("f16", "bf16")[i % 2]
            sched = GemvConfig(bits=bits, splits=(1, 3)[i % 2], **shape).schedule
            cases.append((f"gemv:{sched}", dtype, bits, "sm90a", [1, shape["tokens"]][i % 2]))
    tiles = [c for c in sm80.FAMILY.catalog() if c.bits == 4 and c.dtype == "f16"]
    for layout in ("sm90a", "sm80"):
        picks = [c for c in tiles if c.layout == layout][:4]
        for i, c in enumerate(picks):
            for j, (mode, split) in enumerate(SM80_LAUNCH):
                sched = c.replace(split_k_mode=mode, split_k=split).schedule
                cases.append((f"sm80:{sched}", ("f16", "bf16")[j % 2], 4, layout, [1, 9, 16, 37][(i + j) % 4]))
    cases += [("gemv:m16_s1_w4x2_u4_xs_sm80", "f16", 4, "sm80", 13),
              ("sm90a:t64x64x128_pp_c1x1_s0", "f16", 4, "sm90a", 50),
              ("sm90a:t128x64x128_coop_c1x1_s0_split2", "bf16", 4, "sm90a", 64),
              ("dequant_mm:dequant_mm_sm90a", "f16", 4, "sm90a", 300),
              ("dequant_mm:dequant_mm", "bf16", 8, "sm80", 70)]
    out = []
    for i, (sched, dtype, bits, layout, m) in enumerate(cases):
        zero = ZERO_KINDS[i % len(ZERO_KINDS)]
        group = GROUPS[i % len(GROUPS)]
        n = 2 * rng.randrange(8, 700)
        if sched.startswith("sm90a:"):
            group, n = 128, 8 * (n // 8)  # a multiple of the tile's K; TMA stores rows of 16 bytes
        k = group * rng.randrange(1, 12) if group != -1 else 8 * rng.randrange(2, 300)
        out.append(pytest.param(sched, dtype, bits, layout, zero, group, m, n, k,
                                id=f"{sched}-{dtype}-u{bits}-{zero}-g{group}-m{m}n{n}k{k}"))
    return out


@pytest.mark.parametrize("schedule,dtype,bits,layout,zero,group,m,n,k", _params())
def test_residual_in_every_family(schedule, dtype, bits, layout, zero, group, m, n, k):
    fam_name = schedule.split(":")[0]
    ok, why = family(fam_name).supports(0)
    if not ok:
        pytest.skip(why)
    seed = seed_of("residual", schedule, dtype, zero, group, m, n, k)
    w, q, ref = _weight(dtype, bits, zero, group, n, k, seed, layout=layout)
    tdtype = DTYPES[dtype]
    cfg = parse_schedule(schedule, dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    x = torch.randn(m, k, device="cuda").to(tdtype)
    residual = torch.randn(m, n, device="cuda").to(tdtype)
    bias = torch.randn(n, device="cuda").to(tdtype) if seed % 2 else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    kept = residual.clone()
    mg.matmul(x, w, bias=bias, config=cfg, out=out, residual=residual)
    expect = mg.reference.matmul(x, q, bias=bias, **ref) + residual.float()
    assert rel_err(out, expect, k) <= TOL[dtype]
    assert torch.equal(residual, kept)  # read, never written


def test_residual_graph_capture_and_batch_dims():
    w, q, ref = _weight("f16", 4, "int", 128, 1024, 2048, seed_of("residual-graph"))
    x = torch.randn(2, 3, 2048, device="cuda").half()
    res = torch.randn(2, 3, 1024, device="cuda").half()
    out = torch.empty(2, 3, 1024, device="cuda", dtype=torch.float16)
    mg.matmul(x, w, out=out, residual=res)  # warm: selection and loading outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mg.matmul(x, w, out=out, residual=res)
    x.copy_(torch.randn_like(x))
    res.copy_(torch.randn_like(res))
    out.fill_(float("nan"))
    graph.replay()
    expect = mg.reference.matmul(x.view(6, 2048), q, **ref).view(2, 3, 1024) + res.float()
    assert rel_err(out, expect, 2048) <= 2e-3


def test_quant_linear_residual_eager_and_compiled():
    lin = torch.nn.Linear(512, 768, bias=True, device="cuda", dtype=torch.float16)
    mod = QuantLinear.from_linear(lin, bits=4, group_size=128)
    x = torch.randn(4, 512, device="cuda").half()
    res = torch.randn(4, 768, device="cuda").half()
    eager = mod(x, residual=res)
    compiled = torch.compile(lambda a, r: mod(a, residual=r), fullgraph=True)(x, res)
    assert torch.equal(compiled, eager)
    # The unfused sum rounds twice (the product, then the add): a rounding step of the sum apart.
    torch.testing.assert_close(eager.float(), mod(x).float() + res.float(), rtol=2e-3, atol=2e-3)


def test_residual_rules_fail_before_launch():
    w, _, _ = _weight("f16", 4, "int", 128, 256, 512, seed_of("residual-rules"))
    x = torch.randn(3, 512, device="cuda").half()
    good = torch.randn(3, 256, device="cuda").half()
    for bad, match in ((torch.randn(3, 255, device="cuda").half(), "output's shape"),
                       (good.float(), "float16"),
                       (good.cpu(), "on cuda"),
                       (torch.randn(256, 3, device="cuda").half().t(), "contiguous"),
                       ([1.0], "torch.Tensor")):
        with pytest.raises((ValueError, TypeError), match=match):
            mg.matmul(x, w, residual=bad)
    with pytest.raises(ValueError, match="must not overlap out"):
        mg.matmul(x, w, residual=good, out=good)
