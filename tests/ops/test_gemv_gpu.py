"""The gemv (decode) family on the GPU: every catalog kernel against the float32 reference
(element-wise) over weight kinds, group sizes (32 included), split counts and ragged shapes; the
sm90a-layout dequantize kernel and dequant_mm; act-order, bias, graph capture, determinism of the
split-K reduction; and the one-weight-copy budget of ``prepack`` on the H100."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import base, gemv
from mixed_gemm.kernels.dequant_mm import DequantMMConfig
from mixed_gemm.kernels.gemv.catalog import shapes_for
from test_sm90a_gpu import DTYPES, TOL, ZERO_KINDS, make_case
from weights import rel_err, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GROUPS = (32, 64, 128, -1)


def _weight(dtype, bits, zero, group, n, k, seed, layout="sm90a", **kw):
    q, s, z, fmt, zm = make_case(bits, zero, group, n, k, seed)
    tdtype = DTYPES[dtype]
    s_t, z_t = s.to(tdtype), None if z is None else z.to(tdtype)
    packed = mg.pack(q, s_t, z_t, format=fmt, bits=bits, group_size=group, zero_mode=zm)
    w = mg.prepack(*(None if t is None else t.cuda() for t in packed), format=fmt, bits=bits, group_size=group,
                   zero_mode=zm, dtype=tdtype, layout=layout, **kw)
    ref = dict(s=s_t.cuda(), z=None if z_t is None else z_t.cuda(), group_size=group, bits=bits,
               zero_mode="offset" if zero == "offset" else "int")
    return w, q.cuda(), ref


def _sweep_params():
    rng = random.Random(14)
    cases = []
    grid = [(shape, dtype, bits) for bits in (4, 8) for shape in shapes_for(bits) for dtype in DTYPES]
    for i, (shape, dtype, bits) in enumerate(grid):
        tokens = shape["tokens"]
        for j in range(2):  # two cases per catalog kernel: kinds, groups, splits and shapes rotate
            zero = ZERO_KINDS[(i + j) % len(ZERO_KINDS)]
            group = GROUPS[(i + 3 * j) % len(GROUPS)]
            n = 2 * rng.randrange(4, 700)                       # ragged vs the 16-row strips and CTA rows
            k = group * rng.randrange(1, 24) if group != -1 else 8 * rng.randrange(2, 400)  # K % 16 may be 8
            m = [1, tokens, rng.randrange(1, tokens + 1)][(i + j) % 3]
            splits = [1, 3, 7][(i + 2 * j) % 3]
            schedule = gemv.GemvConfig(bits=bits, splits=splits, **shape).schedule
            cases.append(pytest.param(schedule, dtype, bits, zero, group, m, n, k,
                                      id=f"{schedule}-{dtype}-u{bits}-{zero}-g{group}-m{m}n{n}k{k}"))
    return cases


@pytest.mark.parametrize("schedule,dtype,bits,zero,group,m,n,k", _sweep_params())
def test_sweep(schedule, dtype, bits, zero, group, m, n, k):
    seed = seed_of(schedule, dtype, bits, zero, group, m, n, k)
    w, q, ref = _weight(dtype, bits, zero, group, n, k, seed)
    tdtype = DTYPES[dtype]
    bias = torch.randn(n, device="cuda").to(tdtype) if seed % 2 else None
    cfg = gemv.GemvConfig.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    x = torch.randn(m, k, device="cuda").to(tdtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    want = mg.reference.matmul(x, q, bias=bias, **ref)
    assert rel_err(out, want, k) <= TOL[dtype]


def _sm80_params():
    """Every sm80-layout catalog kernel (the Ampere/Ada one-copy decode path; it runs on the H100
    too), on that layout's weights: zero kinds are compiled in, groups and splits rotate."""
    rng = random.Random(80)
    cases = []
    kernels = [c for c in gemv.FAMILY.catalog() if c.layout == "sm80"]
    for i, c in enumerate(kernels):
        zero = {"sym": "sym", "int": "int", "float": "float", "offset": "offset"}[c.zero_mode]
        group = GROUPS[i % len(GROUPS)]
        n = 2 * rng.randrange(4, 700)
        k = group * rng.randrange(1, 24) if group != -1 else 8 * rng.randrange(2, 400)
        m = [1, 16, rng.randrange(2, 16)][i % 3]
        splits = [1, 3, 7][(i // 3) % 3]
        schedule = c.replace(splits=splits).schedule
        cases.append(pytest.param(schedule, c.dtype, c.bits, zero, group, m, n, k,
                                  id=f"{schedule}-{c.dtype}-u{c.bits}-{zero}-g{group}-m{m}n{n}k{k}"))
    return cases


@pytest.mark.parametrize("schedule,dtype,bits,zero,group,m,n,k", _sm80_params())
def test_sm80_layout_sweep(schedule, dtype, bits, zero, group, m, n, k):
    seed = seed_of("sm80", schedule, dtype, bits, zero, group, m, n, k)
    w, q, ref = _weight(dtype, bits, zero, group, n, k, seed, layout="sm80")
    tdtype = DTYPES[dtype]
    bias = torch.randn(n, device="cuda").to(tdtype) if seed % 2 else None
    cfg = gemv.GemvConfig.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    x = torch.randn(m, k, device="cuda").to(tdtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    assert rel_err(out, mg.reference.matmul(x, q, bias=bias, **ref), k) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero", ZERO_KINDS)
def test_dequantize_and_dequant_mm_read_the_sm90a_layout(dtype, bits, zero):
    n, k, group = 328, 512, 32  # group 32: no sm90a tile serves it; dequant_mm and sm90s do
    w, q, ref = _weight(dtype, bits, zero, group, n, k, seed_of("dq90", dtype, bits, zero))
    dense = mg.dequantize(w)
    want = mg.reference.dequantize(q, ref["s"], ref["z"], group_size=group, bits=bits, zero_mode=ref["zero_mode"])
    # One fma in the activation dtype from the rounded additive zero: within a few units of its last place.
    assert torch.allclose(dense.float(), want, atol=4 * TOL[dtype] * want.abs().max().item(), rtol=0)
    x = torch.randn(300, k, device="cuda").to(DTYPES[dtype])
    cfg = DequantMMConfig.from_schedule("dequant_mm_sm90a", dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    y = mg.matmul(x, w, config=cfg)
    assert rel_err(y, mg.reference.matmul(x, q, **ref), k) <= TOL[dtype]
    assert mg.explain(300, w).family.name in ("sm90a", "sm90s", "dequant_mm")
    out = torch.full((300, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    mg.matmul(x, w, out=out)  # whatever selection picks reads the same copy, the N tail included
    assert rel_err(out, mg.reference.matmul(x, q, **ref), k) <= TOL[dtype]


def test_act_order_bias_and_selection():
    n, k, g = 1000, 1024, 128
    gen = torch.Generator().manual_seed(seed_of("act-order-gemv"))
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s = ((torch.rand(n, k // g, generator=gen) + 0.5) * (2.0 / (16 * k**0.5))).half()
    z = torch.randint(0, 16, (n, k // g), generator=gen).half()
    g_idx = torch.randperm(k, generator=gen) % (k // g)
    w = mg.prepack(q.cuda(), s.cuda(), z.cuda(), format="plain", bits=4, group_size=g, g_idx=g_idx.cuda(),
                   layout="sm90a")
    bias = torch.randn(n, device="cuda").half()
    for m in (1, 5, 16, 32):
        x = torch.randn(m, k, device="cuda").half()
        y = mg.matmul(x, w, bias=bias)  # selection (profile or heuristic)
        # gemv at a few tokens; from 5 the profile may pick the sm80 tiles' or the sm90a family's
        # 32-token tile (the same copy, the same permute)
        assert mg.explain(m, w).family.name in (("gemv",) if m == 1 else ("gemv", "sm80", "sm90a", "sm90s"))
        ref = mg.reference.matmul(x, q.cuda(), s.cuda(), z.cuda(), group_size=g, bits=4, g_idx=g_idx.cuda(), bias=bias)
        assert rel_err(y, ref, k) <= 2e-3


def test_split_k_is_deterministic_and_graph_capturable():
    w, q, ref = _weight("f16", 4, "int", 128, 4096, 4096, seed_of("gemv-det"))
    cfg = gemv.GemvConfig.from_schedule("m8_s2_w4x2_u8_split8", zero_mode="int")
    x = torch.randn(3, 4096, device="cuda").half()
    y1 = mg.matmul(x, w, config=cfg)
    y2 = mg.matmul(x, w, config=cfg)
    assert torch.equal(y1, y2)  # slices summed in slice order, whoever arrives last
    out = torch.empty_like(y1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mg.matmul(x, w, config=cfg, out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y1)  # the arrival counters were left at zero by every launch
    assert rel_err(y1, mg.reference.matmul(x, q, **ref), 4096) <= 2e-3


@pytest.mark.skipif(not torch.cuda.is_available() or base.compute_capability(0) != (9, 0),
                    reason="the one-copy layout of the H100")
@pytest.mark.parametrize("bits,group", [(4, 128), (4, 32), (8, 64), (4, -1)])
def test_one_weight_copy_on_the_h100(bits, group):
    """``prepack(layout="sm90a")`` on the H100 keeps one copy that every M runs from (gemv, sm90a,
    dequant_mm): its bytes are within 1.05x of the packed codes plus scales and zeros."""
    n, k = 4096, 4096
    gen = torch.Generator().manual_seed(bits + group)
    groups = 1 if group == -1 else k // group
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8).cuda()
    s = (torch.rand(n, groups, generator=gen) + 0.5).half().cuda() / 256
    z = torch.randint(0, 2**bits, (n, groups), generator=gen).half().cuda()
    w = mg.prepack(q, s, z, format="plain", bits=bits, group_size=group, layout="sm90a")
    assert w.layout == "sm90a" and w.aux == ()
    assert w.nbytes <= 1.05 * (n * k * bits // 8 + 2 * 2 * groups * n)
    for m in (1, 16, 64, 256):  # every M runs from that one copy
        x = torch.randn(m, k, device="cuda").half()
        y = mg.matmul(x, w)
        ref = mg.reference.matmul(x, q, s, z, group_size=group, bits=bits)
        assert rel_err(y, ref, k) <= 2e-3
