"""Sm80Config: naming, validation, launch geometry."""
import pytest

from mixed_gemm.kernels import sm80
from mixed_gemm.kernels.sm80 import Sm80Config


def test_names():
    assert Sm80Config().name == "mg_sm80_f16_u4_zint_t128x128x64_w2x2x1_s4"
    assert Sm80Config(dtype="bf16", bits=8, zero_mode="offset", tile=(16, 64, 128), warps=(1, 1, 4)).kernel_name \
        == "mg_sm80_bf16_u8_zoffset_t16x64x128_w1x1x4_s4"


def test_configs_are_values():
    a, b = Sm80Config(tile=(64, 128, 64)), Sm80Config(tile=(64, 128, 64))
    assert a is not b and a == b and hash(a) == hash(b)
    assert {a: 1}[b] == 1
    assert a != Sm80Config(tile=(64, 128, 64), stages=3) and a != a.replace(split_k_mode="fused", split_k=2)


def test_launch_fields_change_name_not_kernel():
    c = Sm80Config(split_k_mode="serial", split_k=4, swizzle=8)
    assert c.name == "mg_sm80_f16_u4_zint_t128x128x64_w2x2x1_s4_kserial4_sw8"
    assert c.kernel_name == Sm80Config().kernel_name and c.kernel == Sm80Config()
    assert sm80.FAMILY.render(c) == sm80.FAMILY.render(Sm80Config())
    # CUTLASS identity swizzle: M tiles times the group size in x, N tile groups in y, slices in z.
    assert c.grid(m=300, n_pad=1024) == (3 * 8, 1, 4)
    assert Sm80Config().grid(m=1, n_pad=4096) == (1, 32, 1)


@pytest.mark.parametrize("schedule", ["t16x64x128_w1x1x4_s4", "t64x128x64_w2x2x1_s4_kfused3", "t16x64x128_w1x1x4_s4_sm90a",
                                      "t32x128x128_w1x2x2_s4_sm90a_kparallel2_sw4",
                                      "t128x128x64_w2x2x1_s4_kparallel2_sw4", "t128x256x64_w2x4x1_s3_sw8"])
def test_schedule_round_trip(schedule):
    c = Sm80Config.from_schedule(schedule, dtype="bf16", bits=8, zero_mode="float")
    assert c.schedule == schedule and (c.dtype, c.bits, c.zero_mode) == ("bf16", 8, "float")


@pytest.mark.parametrize("bad", ["dequant_mm", "t16x64_w1x1x4_s4", "t16x64x128_w1x1x4_s4_ktree2"])
def test_bad_schedule(bad):
    with pytest.raises(ValueError, match="schedule|split_k_mode"):
        Sm80Config.from_schedule(bad)


@pytest.mark.parametrize("bad,msg", [
    (dict(bits=3), "bits"),
    (dict(zero_mode="hqq"), "zero_mode"),
    (dict(dtype="f32"), "dtype"),
    (dict(split_k=2), "split_k > 1 needs"),
    (dict(split_k_mode="serial", split_k=0), "split_k must be"),
    (dict(split_k_mode="tree"), "split_k_mode"),
    (dict(swizzle=3), "swizzle"),
    (dict(tile=(128, 128, 32)), "BK"),
    (dict(tile=(24, 128, 64), warps=(1, 2, 1)), "BM"),
    (dict(tile=(64, 96, 64), warps=(1, 1, 1)), "BN"),
    (dict(tile=(16, 64, 64), warps=(1, 1, 3)), "warps K"),
    (dict(stages=1), "stages"),
])
def test_config_rules(bad, msg):
    with pytest.raises(ValueError, match=msg):
        Sm80Config(**bad)


@pytest.mark.parametrize("c", [Sm80Config(bits=8, zero_mode="sym", tile=(64, 128, 64), warps=(2, 2, 1)),
                               Sm80Config(dtype="bf16", zero_mode="offset", tile=(16, 64, 128), warps=(1, 1, 4))])
def test_render_asserts(c):
    src = sm80.FAMILY.render(c)
    assert f"Kernel::kSmemBytes == {c.smem_bytes}" in src
    assert f'extern "C" __global__ void __launch_bounds__({c.threads}) {c.kernel_name}(' in src
    assert f"{c.kernel_name}_reduce(" in src
    assert ("cutlass::bfloat16_t" in src) == (c.dtype == "bf16")


def test_sm90a_layout_kernels():
    """On the sm90a layout the zero mode is not compiled in (the additive zero is always stored), so
    every zero kind shares one kernel, with room for the zeros in shared memory."""
    kinds = [Sm80Config.from_schedule("t16x64x128_w1x1x4_s4_sm90a_kfused4", zero_mode=z) for z in ("sym", "int", "float")]
    assert {c.kernel_name for c in kinds} == {"mg_sm80_f16_u4_t16x64x128_w1x1x4_s4_sm90a"}
    assert kinds[0].name == "mg_sm80_f16_u4_zsym_t16x64x128_w1x1x4_s4_sm90a_kfused4"
    assert len({c.smem_bytes for c in kinds}) == 1
    assert kinds[0].smem_bytes > Sm80Config.from_schedule("t16x64x128_w1x1x4_s4", zero_mode="sym").smem_bytes
    src = sm80.FAMILY.render(kinds[0])
    assert '#include "sm80/gemm_sm80.cuh"' in src and "true>;" in src
    with pytest.raises(ValueError, match="layout must be one of"):
        Sm80Config(layout="sm75")


def test_sm90a_layout_catalog_candidates_and_reads():
    from mixed_gemm.kernels.base import Problem
    from mixed_gemm.kernels.sm80.catalog import SHAPES_SM90A

    cat = [c for c in sm80.FAMILY.catalog() if c.layout == "sm90a"]
    assert len(cat) == len(SHAPES_SM90A) * 4 and {c.zero_mode for c in cat} == {"int"}
    one = Problem(m=16, n=4096, k=4096, dtype="f16", bits=4, zero_mode="sym", group_size=128, layout="sm90a")
    two = Problem(**{**one.__dict__, "layout": "sm80+sm90a"})
    fam = sm80.FAMILY
    assert fam.reads_weight(one)[0] and fam.reads_weight(two)[0]
    assert not fam.reads_weight(Problem(**{**one.__dict__, "layout": "lowbit"}))[0]
    cands = fam.candidates(one, 132)
    assert cands and all("_sm90a" in s for s in cands)
    assert any("_sm90a" in s for s in fam.candidates(two, 132)) and any("_sm90a" not in s for s in fam.candidates(two, 132))
    h = fam.heuristic(one, 132)
    assert h.layout == "sm90a" and fam.can_implement(h, one)[0] and (h.tile, h.warps, h.stages) in SHAPES_SM90A
    assert fam.heuristic(Problem(**{**one.__dict__, "m": 64}), 132) is None  # the wgmma family takes it
    # An entry measured on the sm80 copy (a two-copy profile) does not serve the one copy: profiled
    # on the other copy, its time says nothing about this kernel (selection passes it over).
    entry = Sm80Config.from_schedule("t16x64x128_w1x1x4_s4_kfused4", zero_mode="sym")
    assert fam.for_layout(entry, one) == entry and not fam.can_implement(entry, one)[0]


def test_lowbit_layout_catalog_candidates_and_reads():
    """The ``_lowbit`` schedules: the decode tiles for 1-3-bit weights, one kernel per dtype and width
    (the additive zero folds every zero mode), offered by the profiler on a lowbit weight only, and
    left to the gemv family by the heuristics; not 1:2-sparse (mma.sp's A fragments: gemv only)."""
    from mixed_gemm.kernels.base import Problem
    from mixed_gemm.kernels.sm80.catalog import SHAPES_LOWBIT

    cat = [c for c in sm80.FAMILY.catalog() if c.layout == "lowbit"]
    assert len(cat) == len(SHAPES_LOWBIT) * 2 * 3 and {c.bits for c in cat} == {1, 2, 3}
    assert {c.zero_mode for c in cat} == {"int"} and all(c.kernel_name.endswith("_lowbit") for c in cat)
    two = Problem(m=16, n=4096, k=4096, dtype="f16", bits=2, zero_mode="float", group_size=64, layout="lowbit")
    fam = sm80.FAMILY
    assert fam.reads_weight(two)[0]
    assert not fam.reads_weight(Problem(**{**two.__dict__, "layout": "sm90a"}))[0]  # 2 bits live in lowbit only
    cands = fam.candidates(two, 132)
    assert cands and all("_lowbit" in s for s in cands)
    h = fam.heuristic(two, 132)
    assert h.layout == "lowbit" and (h.tile, h.warps, h.stages) in SHAPES_LOWBIT and fam.can_implement(h, two)[0]
    assert fam.heuristic(Problem(**{**two.__dict__, "m": 64}), 132) is None  # dequant_mm takes it
    cfg = Sm80Config.from_schedule("t16x64x128_w1x1x4_s4_lowbit_kfused4", bits=3, zero_mode="float")
    assert cfg.layout == "lowbit" and cfg.kernel.zero_mode == "int" and fam.can_implement(cfg, two)[0] is False
    assert fam.can_implement(cfg, Problem(**{**two.__dict__, "bits": 3}))[0]
    # 1:2-sparse 7 bits: not read here (its problem is gemv's and dequant_mm's); 3 bits 3/8 of a byte per weight.
    with pytest.raises(ValueError, match="bits must be one of"):
        Sm80Config.from_schedule("t16x64x128_w1x1x4_s4_lowbit", bits=7)
    assert not fam.reads_weight(Problem(**{**two.__dict__, "bits": 7}))[0]
    assert cfg.smem_bytes == 4 * (16 * 128 * 2 + 128 * 64 * 3 // 8 + 2 * 4 * 64 * 2)
    with pytest.raises(ValueError, match="bits must be one of"):
        Sm80Config(bits=4, layout="lowbit")
    with pytest.raises(ValueError, match="bits must be one of"):
        Sm80Config(bits=2, layout="sm90a")
