"""1-, 2-, 3-bit and 1:2-sparse 7-bit weights on the GPU (the lowbit layout): every catalog gemv
kernel and every sm80 ``_lowbit`` tile of those widths (1-3 bits: 1:2-sparse runs mma.sp in gemv only),
and selection over M in {1, 3, 16, 64, 300} (gemv or the sm80 tiles up to 32 tokens, above the tiles
or dequantize + cuBLAS as profiled) for every width x group
32/64/128 x fp16/bf16, element-wise against the float32 reference; HQQ float zeros; the dequantize
kernel; the sparse pattern's exact zeros."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import gemv, sm80
from mixed_gemm.kernels.gemv.catalog import shapes_for
from test_sm90a_gpu import DTYPES, TOL
from weights import deterministic_and_replayable, rel_err, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
WIDTHS = (1, 2, 3, 7)
GROUPS = (32, 64, 128)


def _case(bits, group, n, k, seed, zero="int"):
    """Canonical (q, s, z, zero_mode): 7 bits through sparsify_quantize (the 1:2 pattern), others random."""
    gen = torch.Generator().manual_seed(seed)
    if bits == 7:
        q, s, z = mg.sparsify_quantize(torch.randn(n, k, generator=gen), group_size=group)
        return q, s * (2.0 / k**0.5), z, "int"
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    s = (torch.rand(n, k // group, generator=gen) + 0.5) * (2.0 / (2**bits * k**0.5))
    if zero == "float":  # HQQ's fractional zero points
        return q, s, torch.rand(n, k // group, generator=gen) * (2**bits - 1), "float"
    return q, s, torch.randint(0, 2**bits, (n, k // group), generator=gen).float(), "int"


def _weight(dtype, bits, group, n, k, seed, zero="int"):
    q, s, z, zm = _case(bits, group, n, k, seed, zero)
    tdtype = DTYPES[dtype]
    s_t, z_t = s.to(tdtype), z.to(tdtype)
    w = mg.prepack(q.cuda(), s_t.cuda(), z_t.cuda(), format="plain", bits=bits, group_size=group, zero_mode=zm,
                   dtype=tdtype)
    assert w.layout == "lowbit"
    return w, dict(q=q.cuda(), s=s_t.cuda(), z=z_t.cuda(), group_size=group, bits=bits)


def _check(y, x, ref, bias, k, dtype):
    want = mg.reference.matmul(x, ref["q"], ref["s"], ref["z"], group_size=ref["group_size"], bits=ref["bits"],
                               bias=bias)
    assert rel_err(y, want, k) <= TOL[dtype]


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", tuple(DTYPES))
def test_every_m_through_selection(bits, group, dtype):
    n, k = 520, 768
    w, ref = _weight(dtype, bits, group, n, k, seed_of("lowbit", bits, group, dtype))
    tdtype = DTYPES[dtype]
    for m in (1, 3, 16, 64, 300):
        x = torch.randn(m, k, device="cuda").to(tdtype)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        mg.matmul(x, w, out=out)
        # Up to 32 tokens gemv or the sm80 family's _lowbit tiles; above, those tiles or dequantize +
        # cuBLAS, as the profile measured them (entries serve 2 octaves of M either side).
        allowed = ("gemv", "sm80") if m <= 32 else ("sm80", "dequant_mm")
        assert mg.explain(m, w).family.name in allowed
        _check(out, x, ref, None, k, dtype)


def _catalog_params():
    cases = []
    for bits in WIDTHS:
        for i, shape in enumerate(shapes_for(bits, "lowbit")):  # 1:2-sparse has no _ds kernels
            for j, dtype in enumerate(DTYPES):
                group = GROUPS[(i + bits + j) % len(GROUPS)]
                splits = (1, 3, 5)[(i + j) % 3]
                m = (1, shape["tokens"])[(bits + j) % 2]
                schedule = gemv.GemvConfig(bits=bits, splits=splits, layout="lowbit", **shape).schedule
                cases.append(pytest.param(schedule, dtype, bits, group, m, id=f"{schedule}-{dtype}-u{bits}-g{group}-m{m}"))
    return cases


@pytest.mark.parametrize("schedule,dtype,bits,group,m", _catalog_params())
def test_every_catalog_kernel(schedule, dtype, bits, group, m):
    n, k = 2 * 347, group * 9  # ragged N (strips, CTA rows); K not a multiple of the 64-wide blocks
    seed = seed_of(schedule, dtype, bits, group, m)
    w, ref = _weight(dtype, bits, group, n, k, seed, zero="float" if bits in (2, 3) and seed % 2 else "int")
    tdtype = DTYPES[dtype]
    bias = torch.randn(n, device="cuda").to(tdtype)
    cfg = gemv.GemvConfig.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    x = torch.randn(m, k, device="cuda").to(tdtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    _check(out, x, ref, bias, k, dtype)


SM80_LAUNCH = (("none", 1, 1), ("fused", 3, 1), ("parallel", 2, 2), ("fused", 8, 4), ("serial", 2, 1))


def _sm80_params():
    cases = []
    kernels = [c for c in sm80.FAMILY.catalog() if c.layout == "lowbit"]
    assert kernels, "the catalog compiles the decode tiles for the lowbit layout"
    for i, c in enumerate(kernels):
        group = GROUPS[i % len(GROUPS)]
        mode, split, swizzle = SM80_LAUNCH[i % len(SM80_LAUNCH)]
        m = (9, 16, 32, 5, 27)[i % 5]
        sched = c.replace(split_k_mode=mode, split_k=split, swizzle=swizzle).schedule
        cases.append(pytest.param(sched, c.dtype, c.bits, group, m, id=f"{sched}-{c.dtype}-u{c.bits}-g{group}-m{m}"))
    return cases


@pytest.mark.parametrize("schedule,dtype,bits,group,m", _sm80_params())
def test_every_sm80_lowbit_tile(schedule, dtype, bits, group, m):
    """Ragged N (16-row strips, 64/128-column tiles); K not a multiple of BK (a k-tile with one
    block row of two) and, at group 32, of the 64-wide blocks (a zero-filled block tail)."""
    n, k = 2 * 389, group * 7
    seed = seed_of("sm80-lowbit", schedule, dtype, bits, group, m)
    w, ref = _weight(dtype, bits, group, n, k, seed, zero="float" if bits in (2, 3) and seed % 2 else "int")
    tdtype = DTYPES[dtype]
    bias = torch.randn(n, device="cuda").to(tdtype) if seed % 3 else None
    cfg = sm80.Sm80Config.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    assert cfg.layout == "lowbit"
    x = torch.randn(m, k, device="cuda").to(tdtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    _check(out, x, ref, bias, k, dtype)


def test_sm80_lowbit_fused_split_is_deterministic_and_graph_capturable():
    w, ref = _weight("f16", 3, 64, 4096, 4096, seed_of("sm80-lowbit-det"))
    cfg = sm80.Sm80Config.from_schedule("t16x64x128_w1x1x4_s4_lowbit_kfused4", bits=3, zero_mode="int")
    x = torch.randn(16, 4096, device="cuda").half()
    first = deterministic_and_replayable(x, w, cfg)
    _check(first, x, ref, None, 4096, "f16")


@pytest.mark.parametrize("bits", WIDTHS)
def test_dequantize_matches_the_reference_and_sparse_zeros_are_exact(bits):
    n, k, g = 96, 512, 64
    w, ref = _weight("f16", bits, g, n, k, seed_of("lowbit-dequant", bits))
    dense = mg.dequantize(w)
    want = mg.reference.dequantize(ref["q"], ref["s"], ref["z"], group_size=g, bits=bits)
    assert torch.allclose(dense.float(), want.float(), atol=2e-3 * want.abs().max().item(), rtol=0)
    if bits == 7:  # the dropped element of every pair is exactly zero
        pairs = dense.view(n, k // 2, 2)
        assert bool(((pairs[..., 0] == 0) | (pairs[..., 1] == 0)).all())


def test_bytes_follow_the_width():
    n, k, g = 4096, 4096, 64
    for bits in (1, 2, 3):
        w, _ = _weight("f16", bits, g, n, k, 1)
        assert w.b.numel() * 4 == n * k * bits // 8  # no padding at this shape
    w, _ = _weight("f16", 7, g, n, k, 1)
    assert w.b.numel() * 4 == n * k // 2  # a byte per pair: int4's bytes
