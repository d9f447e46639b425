"""The configuration space on the GPU: every catalog shape x dtype x bits x zero kind x group
size, on ragged random shapes, with split-K modes and swizzles rotated through the cases."""
import itertools
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels.sm80.catalog import SHAPES
from weights import rel_err, seed_of

pytestmark = pytest.mark.gpu

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
TOL = {"f16": 2e-3, "bf16": 1e-2}
ZERO_KINDS = ("sym", "int", "float", "offset")
GROUPS = (32, 64, 128, -1)
LAUNCH = [("none", 1, 1), ("serial", 3, 2), ("parallel", 2, 4), ("fused", 5, 8), ("none", 1, 8),
          ("parallel", 4, 1), ("fused", 3, 1), ("serial", 5, 4), ("fused", 8, 2)]


def make_case(bits, zero, group_size, n, k, device="cuda", seed=0):
    """Random canonical weight of a zero kind, and the (format, zero_mode) that carries it."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else k // group_size
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    s = ((torch.rand(n, groups, generator=gen) + 0.5) * (2.0 / (2**bits * k**0.5)))
    if zero == "sym":
        z, fmt, zm = None, "gptq", "int"
    elif zero == "int":
        z, fmt, zm = torch.randint(0, 2**bits, (n, groups), generator=gen).float(), \
            ("awq" if bits == 4 else "gptq_v2"), "int"
    elif zero == "float":  # HQQ: fractional zero points
        z, fmt, zm = torch.rand(n, groups, generator=gen) * (2**bits - 1), "plain", "float"
    else:  # offset m, w = q s + m
        z, fmt, zm = -(torch.rand(n, groups, generator=gen) * 2**bits) * s, "plain", "offset"
    return q.to(device), s, z, fmt, zm


def _case_params():
    rng = random.Random(1234)
    cases = []
    for i, ((tile, warps, stages), dtype, bits, zero, group) in enumerate(
            itertools.product(SHAPES, DTYPES, (4, 8), ZERO_KINDS, GROUPS)):
        gs = 64 if group == -1 else group
        # Ragged N: even for the plain format, a multiple of 8 where AWQ/GPTQ pack zeros along N.
        n = 2 * rng.randrange(20, 400) if zero in ("float", "offset", "sym") else 8 * rng.randrange(5, 100)
        k = gs * rng.randrange(1, 9) if group != -1 else 8 * rng.randrange(5, 70)  # ragged vs 16/64/128
        m = rng.choice([1, 3, 17, 64, 100, 257])
        split_mode, split, swizzle = LAUNCH[i % len(LAUNCH)]
        cases.append(pytest.param(tile, warps, stages, dtype, bits, zero, group, m, n, k, split_mode, split, swizzle,
                                  id=f"t{tile[0]}x{tile[1]}x{tile[2]}-{dtype}-u{bits}-{zero}-g{group}-"
                                     f"m{m}n{n}k{k}-{split_mode}{split}-sw{swizzle}"))
    return cases


@pytest.mark.parametrize("tile,warps,stages,dtype,bits,zero,group,m,n,k,split_mode,split,swizzle", _case_params())
def test_sweep(tile, warps, stages, dtype, bits, zero, group, m, n, k, split_mode, split, swizzle):
    seed = seed_of(tile, dtype, bits, zero, group, m, n, k)
    q, s, z, fmt, zm = make_case(bits, zero, group, n, k, seed=seed)
    tdtype = DTYPES[dtype]
    s_t = s.to(tdtype)
    z_t = None if z is None else z.to(tdtype)
    packed = mg.pack(q.cpu(), s_t, z_t, format=fmt, bits=bits, group_size=group, zero_mode=zm)
    w = mg.prepack(*(None if t is None else t.cuda() for t in packed), format=fmt, bits=bits, group_size=group,
                   zero_mode=zm, dtype=tdtype, layout="sm80")
    cfg = mg.KernelConfig(dtype=dtype, bits=bits, zero_mode=w.zero_mode, tile=tile, warps=warps, stages=stages,
                          split_k_mode=split_mode, split_k=split, swizzle=swizzle)
    x = torch.randn(m, k, device="cuda").to(tdtype)
    bias = torch.randn(n, device="cuda").to(tdtype) if seed % 2 else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    ref = mg.reference.matmul(x, q, s_t.cuda(), None if z_t is None else z_t.cuda(), group_size=group, bits=bits,
                              bias=bias, zero_mode="offset" if zero == "offset" else "int")
    torch.cuda.synchronize()
    assert rel_err(out, ref, k) <= TOL[dtype]


@pytest.mark.parametrize("mode", ["serial", "parallel", "fused"])
def test_split_k_is_deterministic(mode):
    q, s, z, fmt, zm = make_case(4, "int", 128, 4096, 8192, seed=3)
    w = mg.prepack(*(t.cuda() for t in mg.pack(q.cpu(), s.half(), z.half(), format=fmt, bits=4, group_size=128)),
                   format=fmt, bits=4, group_size=128, layout="sm80")
    x = torch.randn(16, 8192, device="cuda").half()
    cfg = mg.KernelConfig(tile=(16, 64, 128), warps=(1, 1, 4), split_k_mode=mode, split_k=8)
    first = mg.matmul(x, w, config=cfg)
    for _ in range(10):
        assert torch.equal(mg.matmul(x, w, config=cfg), first)
    ref = mg.reference.matmul(x, q, s.half().cuda(), z.half().cuda(), group_size=128, bits=4)
    assert rel_err(first, ref, 8192) <= 2e-3


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero", ZERO_KINDS)
def test_dequantize_matches_reference(dtype, bits, zero):
    n, k, group = 328, 200, -1 if zero == "float" else 64
    k = 256 if group == 64 else k
    q, s, z, fmt, zm = make_case(bits, zero, group, n, k, seed=bits)
    tdtype = DTYPES[dtype]
    s_t, z_t = s.to(tdtype), None if z is None else z.to(tdtype)
    packed = mg.pack(q.cpu(), s_t, z_t, format=fmt, bits=bits, group_size=group, zero_mode=zm)
    w = mg.prepack(*(None if t is None else t.cuda() for t in packed), format=fmt, bits=bits, group_size=group,
                   zero_mode=zm, dtype=tdtype, layout="sm80")
    out = torch.full((n, k), float("nan"), device="cuda", dtype=tdtype)
    got = mg.dequantize(w, out=out)
    ref = mg.reference.dequantize(q, s_t.cuda(), None if z_t is None else z_t.cuda(), group_size=group, bits=bits,
                                  zero_mode="offset" if zero == "offset" else "int").to(tdtype)
    # Integer zeros: (q - z) is exact and (q - z) s fits fp32, so the 16-bit product rounds once like
    # the reference. Float zeros / offsets: the kernel evaluates the reference's fp32 formula.
    assert torch.equal(got, ref)


def act_order_case(n, k, g, seed, tdtype):
    """A GPTQ act-order weight: canonical (q, s, z, g_idx) on the CPU and its PackedWeight on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s = ((torch.rand(n, k // g, generator=gen) + 0.5) * 0.01).to(tdtype)
    z = torch.randint(0, 16, (n, k // g), generator=gen).to(tdtype)
    g_idx = (torch.arange(k) // g)[torch.randperm(k, generator=gen)].int()
    packed = mg.pack(q, s, z, format="gptq", bits=4, group_size=g, g_idx=g_idx)
    w = mg.prepack(*(t.cuda() for t in packed), format="gptq", bits=4, group_size=g, g_idx=g_idx.cuda(), dtype=tdtype, layout="sm80")
    return q, s, z, g_idx, w


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_act_order(dtype):
    n, k, g = 512, 1024, 128
    tdtype = DTYPES[dtype]
    q, s, z, g_idx, w = act_order_case(n, k, g, 8, tdtype)
    x = torch.randn(9, k, device="cuda").to(tdtype)
    ref = mg.reference.matmul(x, q.cuda(), s.cuda(), z.cuda(), group_size=g, bits=4, g_idx=g_idx.cuda())
    assert rel_err(mg.matmul(x, w), ref, k) <= TOL[dtype]
    dq = mg.dequantize(w)
    assert torch.equal(dq, mg.reference.dequantize(q.cuda(), s.cuda(), z.cuda(), group_size=g, bits=4,
                                                   g_idx=g_idx.cuda()).to(tdtype))


def test_heuristic_split_k_decode():
    q, s, z, fmt, zm = make_case(4, "int", 128, 4096, 4096, seed=5)
    w = mg.prepack(*(t.cuda() for t in mg.pack(q.cpu(), s.half(), z.half(), format=fmt, bits=4, group_size=128)),
                   format=fmt, bits=4, group_size=128, layout="sm80")
    x = torch.randn(1, 4096, device="cuda").half()
    y = mg.matmul(x, w)
    chosen = mg.explain(x, w)
    assert (chosen.family.name, chosen.source) == ("sm80", "heuristic") or chosen.source.startswith("profile")
    if chosen.source == "heuristic":
        assert chosen.config.split_k > 1  # 64 column blocks on 132 SMs: the heuristic splits K
    ref = mg.reference.matmul(x, q, s.half().cuda(), z.half().cuda(), group_size=128, bits=4)
    assert rel_err(y, ref, 4096) <= 2e-3


def _weight_4096(seed=5, k=4096):
    q, s, z, fmt, zm = make_case(4, "int", 128, 4096, k, seed=seed)
    w = mg.prepack(*(t.cuda() for t in mg.pack(q.cpu(), s.half(), z.half(), format=fmt, bits=4, group_size=128)),
                   format=fmt, bits=4, group_size=128, layout="sm80")
    return q, s.half().cuda(), z.half().cuda(), w


def test_fused_split_k_in_cuda_graph():
    """The arrival counters reset themselves: replays (and eager calls in between) stay exact."""
    q, s, z, w = _weight_4096(seed=11)
    cfg = mg.KernelConfig(tile=(16, 64, 128), warps=(1, 1, 4), split_k_mode="fused", split_k=4)
    x = torch.randn(3, 4096, device="cuda").half()
    out = torch.full((3, 4096), float("nan"), device="cuda", dtype=torch.float16)
    eager = mg.matmul(x, w, config=cfg)
    graph = torch.cuda.CUDAGraph()
    mg.matmul(x, w, config=cfg, out=out)  # warm up outside capture
    with torch.cuda.graph(graph):
        mg.matmul(x, w, config=cfg, out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(mg.matmul(x, w, config=cfg), eager)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert rel_err(eager, mg.reference.matmul(x, q.cuda(), s, z, group_size=128, bits=4), 4096) <= 2e-3


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dequant_mm_method(dtype):
    """Large-M strategy: dense weight then cuBLAS, with bias, out= and act-order."""
    n, k, g = 384, 512, 128
    tdtype = DTYPES[dtype]
    q, s, z, g_idx, w = act_order_case(n, k, g, 21, tdtype)
    cfg = mg.DequantMMConfig(dtype=dtype, bits=4, zero_mode="int")
    x = torch.randn(2, 70, k, device="cuda").to(tdtype)
    bias = torch.randn(n, device="cuda").to(tdtype)
    out = torch.full((2, 70, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    ref = mg.reference.matmul(x, q.cuda(), s.cuda(), z.cuda(), group_size=g, bits=4, g_idx=g_idx.cuda(), bias=bias)
    assert rel_err(out, ref, k) <= TOL[dtype]


def test_profile_drives_selection(tmp_path, monkeypatch):
    """A profile entry for this GPU and shape wins over the heuristics; nearest M bucket."""
    from mixed_gemm.select import PROFILE_ENV, Profile, profiles

    q, s, z, w = _weight_4096(seed=13)
    entry = dict(dtype="f16", bits=4, zero_mode="int", group_size=128, n=4096, k=4096, schedule="t32x64x128_w1x1x4_s4_kserial2")
    prof = Profile({"name": torch.cuda.get_device_name()}, {}, [dict(entry, m=16), dict(entry, m=1024, schedule="dequant_mm")])
    prof.save(tmp_path / "p.json")
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "p.json"))
    profiles.clear_cache()
    mg.select.clear_selection()
    try:
        for m, schedule, bucket in [(5, "sm80:t32x64x128_w1x1x4_s4_kserial2", 16), (600, "dequant_mm:dequant_mm", 1024)]:
            x = torch.randn(m, 4096, device="cuda").half()
            y = mg.matmul(x, w)
            chosen = mg.explain(m, w)
            assert (chosen.schedule, chosen.source) == (schedule, f"profile p.json M={bucket}")
            assert rel_err(y, mg.reference.matmul(x, q.cuda(), s, z, group_size=128, bits=4), 4096) <= 2e-3
    finally:
        profiles.clear_cache()
        mg.select.clear_selection()


def test_schedule_env_override(monkeypatch):
    from mixed_gemm.select import SCHEDULE_ENV

    q, s, z, w = _weight_4096(seed=17)
    mg.select.clear_selection()
    monkeypatch.setenv(SCHEDULE_ENV, "sm80:t64x64x128_w2x1x2_s4_kfused2_sw2")
    try:
        x = torch.randn(40, 4096, device="cuda").half()
        y = mg.matmul(x, w)
        chosen = mg.explain(x, w)
        assert chosen.config.name == "mg_sm80_f16_u4_zint_t64x64x128_w2x1x2_s4_kfused2_sw2"
        assert chosen.source == "override"
        assert rel_err(y, mg.reference.matmul(x, q.cuda(), s, z, group_size=128, bits=4), 4096) <= 2e-3
    finally:
        mg.select.clear_selection()


@pytest.mark.parametrize("schedule", [None, "t16x64x128_w1x1x4_s4_kfused2", "t64x128x64_w2x2x1_s4", "dequant_mm"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ragged_last_group(schedule, dtype):
    """K = 576 at group 128 (SmolLM2): five groups, the last of 64 columns."""
    n, k, g = 1536, 576, 128
    tdtype = DTYPES[dtype]
    torch.manual_seed(3)
    w = torch.randn(n, k) * 0.05
    q, s, z = mg.quantize(w.to(tdtype), bits=4, group_size=g)
    assert s.shape == (n, 5)
    packed = mg.pack(q, s, z, format="awq", bits=4, group_size=g)
    pw = mg.prepack(*(t.cuda() for t in packed), format="awq", bits=4, group_size=g, dtype=tdtype, layout="sm80")
    cfg = None if schedule is None else mg.kernels.parse_schedule(schedule, dtype=dtype, bits=4, zero_mode="int")
    for m in (1, 17):
        x = torch.randn(m, k, device="cuda").to(tdtype)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        mg.matmul(x, pw, config=cfg, out=out)
        ref = mg.reference.matmul(x, q.cuda(), s.cuda(), z.cuda(), group_size=g, bits=4)
        assert rel_err(out, ref, k) <= TOL[dtype]
    dq = mg.reference.dequantize(q.cuda(), s.cuda(), z.cuda(), group_size=g, bits=4).to(tdtype)
    assert torch.equal(mg.dequantize(pw), dq)
