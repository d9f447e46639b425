"""The gemv family's config, launch geometry, heuristics and candidates (CPU)."""
import pytest

from mixed_gemm.kernels import Problem, gemv
from mixed_gemm.kernels.gemv import GemvConfig
from mixed_gemm.kernels.gemv.candidates import candidate_schedules
from mixed_gemm.kernels.gemv.config import MAX_RING_SMEM, MAX_STATIC_SMEM

IDENTITIES = {c.kernel_name for c in gemv.FAMILY.catalog()}


@pytest.mark.parametrize("schedule", ["m8_s2_w4x2_u8", "m16_s1_w2x4_u8_xs_split5", "m32_s1_w4x2_u4_xs"])
def test_schedule_round_trip_and_names(schedule):
    c = GemvConfig.from_schedule(schedule, dtype="bf16", bits=4, zero_mode="float")
    assert c.schedule == schedule and c.kernel.splits == 1 and c.kernel.zero_mode == "int"
    assert c.kernel_name.startswith("mg_gemv_bf16_u4_m") and ("_xs" in c.kernel_name) == ("_xs" in schedule)
    with pytest.raises(ValueError, match="not a gemv schedule"):
        GemvConfig.from_schedule("t16x64x128_w1x1x4_s4")


def test_rules_and_static_shared_memory():
    with pytest.raises(ValueError, match=r"tokens must be one of \(1, 2, 4, 8, 16, 32\)"):
        GemvConfig(tokens=12)
    with pytest.raises(ValueError, match="the FMA variant .* reads the sm90a or lowbit layout"):
        GemvConfig(tokens=1, layout="sm80")
    fma = GemvConfig.from_schedule("m1_s2_w4x2_u8_split4")
    assert fma.fma and fma.accumulators == 4 and fma.schedule == "m1_s2_w4x2_u8_split4"
    assert not GemvConfig(tokens=8).fma
    with pytest.raises(ValueError, match="unroll must be a power of two"):
        GemvConfig(unroll=3)
    with pytest.raises(ValueError, match="shared memory"):
        GemvConfig(tokens=32, strips=2, warps=(4, 4), unroll=16, stage_x=True)
    assert all(c.smem_bytes <= (MAX_RING_SMEM if c.dynamic_smem else MAX_STATIC_SMEM) for c in gemv.FAMILY.catalog())
    big = GemvConfig(tokens=16, strips=1, warps=(1, 8), unroll=16, stage_x=True)  # x stages above 48 KB
    assert big.smem_bytes > MAX_STATIC_SMEM and big.dynamic_smem and not GemvConfig(stage_x=True).dynamic_smem


def test_deferred_scaling_schedules():
    c = GemvConfig.from_schedule("m8_s2_w8x1_u8_ds_o3_split6", dtype="bf16", bits=8)
    assert (c.deferred, c.occupancy, c.splits, c.schedule) == (True, 3, 6, "m8_s2_w8x1_u8_ds_o3_split6")
    assert c.kernel_name == "mg_gemv_bf16_u8_m8_s2_w8x1_u8_ds_o3" and "deferred=True" in repr(c)
    assert "deferred" not in repr(GemvConfig())  # the other kernels keep their sources and cache keys
    for bad, rule in (({"tokens": 1}, "mma kernels"), ({"bits": 7, "layout": "lowbit"}, "not 1:2-sparse"),
                      ({"tokens": 16, "layout": "sm80"}, "sm90a and lowbit layouts")):
        with pytest.raises(ValueError, match=rule):
            GemvConfig(deferred=True, **bad)
    assert "0, 1, true, true>;" in gemv.FAMILY.render(c)  # kDeferred, kCapped (the _o3 register cap)
    # 1-3 bits, with or without a ring: the ring's kernel gets kDeferred after kFmaTokens
    ring = GemvConfig.from_schedule("m8_s4_w2x2_u8_p3_ds_split2", bits=3)
    assert (ring.layout, ring.stages, ring.deferred, ring.schedule) == ("lowbit", 3, True, "m8_s4_w2x2_u8_p3_ds_split2")
    assert "3, 0, true>;" in gemv.FAMILY.render(ring)


def test_ring_schedules_names_and_shared_memory_by_m():
    c = GemvConfig.from_schedule("m8_s4_w2x2_u8_p3_split2", bits=2)
    assert (c.layout, c.stages, c.splits, c.schedule) == ("lowbit", 3, 2, "m8_s4_w2x2_u8_p3_split2")
    assert c.kernel_name == "mg_gemv_f16_u2_m8_s4_w2x2_u8_p3" and "stages=3" in repr(c)
    # The kernels without a ring keep the repr (so the generated source and cache key) they had.
    assert "stages" not in repr(GemvConfig()) and repr(GemvConfig()).endswith("layout='sm90a', splits=1)")
    # Per warp and stage: 2 blocks x 4 strips x 256 bytes of 2-bit weight, the 4 strips' 16 scales
    # and zeros of each group the 128-k step touches; per K-warp row (2) and stage, min(M, 8) x
    # slices of 8 x 32 + 16 bytes.
    reduce = 1 * 2 * c.accumulators * 32 * 4
    assert c.ring_smem_bytes(1, 64) == reduce + 3 * (4 * (2048 + 2 * 256) + 2 * 272)
    assert c.ring_smem_bytes(1, 4096) == reduce + 3 * (4 * (2048 + 256) + 2 * 272)
    assert c.ring_smem_bytes(8, 32) == c.ring_smem_bytes(30, 32) == c.smem_bytes == reduce + 3 * (4 * (2048 + 4 * 256) + 2 * 8 * 272)
    with pytest.raises(ValueError, match="stages must be one of"):
        GemvConfig(stages=5)
    with pytest.raises(ValueError, match="always stage x"):
        GemvConfig(stages=3, stage_x=True)
    with pytest.raises(ValueError, match="opt-in limit"):
        GemvConfig(tokens=32, strips=8, warps=(4, 4), unroll=32, stages=4)


@pytest.mark.parametrize("n,k,splits", [(4096, 4096, 8), (200, 392, 7), (57344, 8192, 1), (16, 16, 32)])
def test_launch_geometry_covers_k_with_nonempty_aligned_splits(n, k, splits):
    c = GemvConfig(splits=splits)
    row_tiles, s, chunk, strips = c.launch_geometry(n, k)
    katoms = -(-k // 16)
    assert strips == -(-n // 16) and row_tiles * c.rows >= 16 * strips
    assert chunk % c.unroll == 0 and 1 <= s <= splits
    assert (s - 1) * chunk < katoms <= s * chunk  # every split has work, together they cover K


def test_heuristic_and_candidates_are_catalog_kernels():
    for m in (1, 3, 8, 9, 16, 17, 32, 33):
        for bits in (4, 8):
            p = Problem(m=m, n=4096, k=4096, dtype="f16", bits=bits, zero_mode="int", group_size=128, layout="sm90a")
            c = gemv.FAMILY.heuristic(p, 132)
            assert (c is None) == (m > 32)
            if c is not None:
                assert c.kernel_name in IDENTITIES and c.tokens >= m and gemv.FAMILY.can_implement(c, p)[0]
            for s in candidate_schedules(m, 4096, 4096, 132, bits):
                cfg = GemvConfig.from_schedule(s, bits=bits)
                assert cfg.kernel_name in IDENTITIES and cfg.tokens >= m
    # Beside the sm80 copy, M > 8 is left to the sm80 decode tiles (measured faster there).
    both = Problem(m=16, n=4096, k=4096, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm80+sm90a")
    assert gemv.FAMILY.heuristic(both, 132) is None
    assert gemv.FAMILY.heuristic(Problem(**dict(both.__dict__, m=4)), 132) is not None


def test_the_sm80_layout_kernel_for_ampere():
    c = GemvConfig.from_schedule("m16_s1_w4x2_u4_xs_sm80_split3", dtype="f16", bits=4, zero_mode="float")
    assert (c.layout, c.tokens, c.rows, c.splits) == ("sm80", 16, 256, 3)
    assert c.kernel.zero_mode == "float" and c.kernel_name == "mg_gemv_f16_u4_zfloat_m16_s1_w4x2_u4_xs_sm80"
    assert c.launch_geometry(1000, 4096)[3] == 16  # strips of 64 columns
    with pytest.raises(ValueError, match="serves 16 tokens"):
        GemvConfig(layout="sm80", tokens=8)
    p = Problem(m=3, n=4096, k=4096, dtype="f16", bits=4, zero_mode="float", group_size=128, layout="sm80")
    assert gemv.FAMILY.can_implement(c, p)[0] and gemv.FAMILY.layout_of(c) == "sm80"
    assert not gemv.FAMILY.can_implement(GemvConfig(), p)[0]  # the sm90a kernel needs that copy
    assert gemv.FAMILY.heuristic(p, 132) is None  # profiles choose it (not yet measured)
    names = candidate_schedules(3, 4096, 4096, 132, 4, ("sm80",))
    assert names and all(s.endswith("_sm80") or "_sm80_split" in s for s in names)
    assert all(GemvConfig.from_schedule(s).kernel_name in IDENTITIES for s in names)
