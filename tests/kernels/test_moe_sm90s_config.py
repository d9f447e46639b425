"""The moe_sm90s (grouped sm90s) family's config, rendering, candidates, can_implement reasons and
registration (CPU)."""
import pytest

from mixed_gemm.kernels import GROUPED_FAMILIES, MoeProblem, family, parse_schedule, qualified
from mixed_gemm.kernels.moe_sm90s import FAMILY, MoeSm90sConfig
from mixed_gemm.kernels.moe_sm90s.candidates import candidate_schedules
from mixed_gemm.kernels.moe_sm90s.catalog import TILES, TILES_U8, default_catalog


def _problem(stage="w13", tokens=16, top_k=2, experts=8, h=4096, inter=14336, **kw):
    n, k = (2 * inter, h) if stage == "w13" else (h, inter)
    base = dict(tokens=tokens, top_k=top_k, experts=experts, n=n, k=k, dtype="f16", bits=4, zero_mode="int",
                group_size=128, layout="sm90a", stage=stage, gate_up=True)
    return MoeProblem(**dict(base, **kw))


@pytest.mark.parametrize("schedule", ["w13_t128x16x128_s0", "w2_t256x64x128_s0_split3", "w13_t128x32x128_s4",
                                      "w2_t128x16x128_s0_p", "w13_t256x128x64_s0_split2_p", "w2_t192x128x128_s0_se_p"])
def test_schedule_round_trip_and_names(schedule):
    c = MoeSm90sConfig.from_schedule(schedule, dtype="bf16", zero_mode="float")
    assert c.schedule == schedule and qualified(c) == f"moe_sm90s:{schedule}"
    assert parse_schedule(qualified(c), dtype="bf16", bits=4, zero_mode="float") == c
    k = c.kernel
    assert (k.stage, k.zero_mode, k.splits, k.persistent) == ("w13", "int", 1, False) and k.kernel == k
    assert c.persistent == schedule.endswith("_p")
    assert c.kernel_name == "mg_moe_sm90s_bf16_u4_" + schedule.split("_", 1)[1].split("_split")[0].removesuffix("_p")
    assert family("moe_sm90s") is FAMILY and FAMILY in GROUPED_FAMILIES
    for bad in ("t128x16x128_s0", "w13_t128x16x128", "w13_t128x16x128_s0_split1", "w13_t128x16x128_s0_p_split2"):
        with pytest.raises(ValueError, match="moe_sm90s schedule"):
            MoeSm90sConfig.from_schedule(bad)


@pytest.mark.parametrize("kw,rule", [
    (dict(stage="w3"), "stage"),
    (dict(tile=(128, 256, 128)), "tile N"),
    (dict(tile=(64, 16, 128)), "tile M"),
    (dict(splits=0), "splits"),
    (dict(bits=3), "bits"),
])
def test_rules_name_what_is_wrong(kw, rule):
    with pytest.raises(ValueError, match=rule):
        MoeSm90sConfig(**kw)


def test_geometry_is_the_dense_kernels_and_rendered_grouped():
    c = MoeSm90sConfig(tile=(256, 64, 128))
    assert (c.threads, c.smem_bytes, c.pipeline_stages) == (640, c.dense.smem_bytes, 6)
    src = FAMILY.render(c)
    assert "Geometry<4, 256, 64, 128, 6, 1, 1, false, true, false, 1, false, false, false>" in src
    assert f"static_assert(Geo::kSmemBytes == {c.smem_bytes}," in src and "mixed_gemm::kGateUpBlock == 8" in src
    assert "__launch_bounds__(640, 1)" in src
    # and each tile with one fragment set (TM = 256 from TN = 32, TM = 192 from TN = 96) again with half issue (_hi)
    half = [k for k in default_catalog() if k.half_issue]
    assert len(half) == 2 * (7 + 1 + 2) and all((k.tile[0], k.tile[1]) >= (192, 96) and k.tile[1] >= 32 for k in half)
    # the three-warpgroup tile: 512 threads, 160 registers a consumer, two fragment sets only at TN = 64
    c = MoeSm90sConfig(tile=(192, 128, 128))
    assert c.threads == 512 and "Geometry<4, 192, 128, 128," in FAMILY.render(c)
    assert [k.tile for k in default_catalog() if k.tile[0] == 192 and not k.half_issue][:3] == [
        (192, 64, 128), (192, 96, 128), (192, 128, 128)]
    # and the 256-row int4 tiles with the gather (_g)
    gather = [k for k in default_catalog() if k.gather]
    assert len(gather) == 2 * 8 and all(k.tile[0] == 256 and k.bits == 4 and not k.half_issue for k in gather)
    assert "false, 1, true, false, false>" in FAMILY.render(gather[0])
    staged = [k for k in default_catalog() if k.staged]
    assert len(staged) == 2 * 4 and all(k.bits == 4 and not (k.gather or k.half_issue) for k in staged)
    assert len({k.kernel_name for k in default_catalog()}) == len(default_catalog()) == (
        2 * (len(TILES) + len(TILES_U8)) + len(half) + len(gather) + len(staged))


def test_gather_is_the_gate_up_stages_and_named_by_its_schedule():
    c = MoeSm90sConfig.from_schedule("w13_t256x80x128_s0_g_p")
    assert c.gather and c.persistent and c.kernel.gather and c.kernel_name.endswith("_t256x80x128_s0_g")
    assert c.schedule == "w13_t256x80x128_s0_g_p"
    with pytest.raises(ValueError, match=r"gather \(_g: x's rows read by index\) is the gate\|up stage's"):
        MoeSm90sConfig(stage="w2", tile=(256, 80, 128), gather=True)
    from mixed_gemm.kernels.base import MoeProblem
    from mixed_gemm.kernels.moe_sm90s.candidates import candidate_schedules
    kind = dict(dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    up = candidate_schedules(MoeProblem(tokens=1024, top_k=8, experts=128, n=1536, k=2048, stage="w13", gate_up=True,
                                        **kind), 132)
    down = candidate_schedules(MoeProblem(tokens=1024, top_k=8, experts=128, n=2048, k=768, stage="w2", **kind), 132)
    assert any(s.endswith("_g") or "_g_" in s for s in up) and not any("_g" in s for s in down)
    assert not any("_hi_g" in s for s in up)  # the catalog's gather tiles have no half issue
    assert not any(k.gather for k in FAMILY.packaged((9, 0)))  # in a package where a profile names them


def test_combine_is_the_down_stages_launch_time_choice_named_by_its_schedule():
    c = MoeSm90sConfig.from_schedule("w2_t256x32x128_s0_split2_p_f")
    assert c.combine and c.splits == 2 and c.persistent and c.schedule == "w2_t256x32x128_s0_split2_p_f"
    assert not c.kernel.combine and c.kernel == MoeSm90sConfig(stage="w13", tile=(256, 32, 128)).kernel  # one binary
    assert c.name.endswith("_w2_t256x32x128_s0_split2_p_f")
    with pytest.raises(ValueError, match=r"combine \(_f: the top-k sum in the epilogue\) is the down stage's"):
        MoeSm90sConfig(stage="w13", tile=(256, 32, 128), combine=True)
    with pytest.raises(ValueError, match=r"is not a moe_sm90s schedule <w13\|w2>"):
        MoeSm90sConfig.from_schedule("w2_t256x32x128_s0_f_p")
    from mixed_gemm.kernels.base import MoeProblem
    from mixed_gemm.kernels.moe_sm90s.candidates import candidate_schedules
    kind = dict(dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    down = candidate_schedules(MoeProblem(tokens=1024, top_k=8, experts=128, n=2048, k=768, stage="w2", **kind), 132)
    up = candidate_schedules(MoeProblem(tokens=1024, top_k=8, experts=128, n=1536, k=2048, stage="w13", gate_up=True,
                                        **kind), 132)
    assert {s[:-2] for s in down if s.endswith("_f")} == {s for s in down if not s.endswith("_f") and "_se" not in s}
    assert not any(s.endswith("_f") for s in up)


def test_half_issue_is_the_dense_rule_and_ships_only_where_a_profile_names_it():
    from mixed_gemm.kernels.moe_sm90s.candidates import candidate_schedules
    from mixed_gemm.select.coverage import selectable_for
    from mixed_gemm.select.profiles import Profile

    c = MoeSm90sConfig.from_schedule("w2_t256x32x128_s0_hi_split2_p")
    assert c.half_issue and c.splits == 2 and c.persistent and c.schedule == "w2_t256x32x128_s0_hi_split2_p"
    assert c.kernel_name == "mg_moe_sm90s_f16_u4_t256x32x128_s0_hi" and c.kernel.half_issue
    src = FAMILY.render(c)
    assert f"Geometry<4, 256, 32, 128, {c.pipeline_stages}, 1, 1, false, true, true, 1, false, false, false>" in src
    assert "static_assert(Geo::kDoubleBuffer == false" in src
    assert "static_assert(Geo::kDoubleBuffer == true" in FAMILY.render(MoeSm90sConfig(tile=(128, 32, 128)))
    for tile in ((128, 32, 128), (256, 16, 128)):  # double-buffered
        with pytest.raises(ValueError, match="half_issue"):
            MoeSm90sConfig(tile=tile, half_issue=True)
    problem = MoeProblem(tokens=256, top_k=8, experts=128, n=1536, k=2048, dtype="f16", bits=4, zero_mode="int",
                         group_size=128, layout="sm90a", stage="w13", gate_up=True)
    cands = candidate_schedules(problem, 132)
    assert "w13_t256x32x128_s0_hi_p" in cands and "w13_t256x32x128_s0_p" in cands
    assert not any("t256x16x128_s0_hi" in s for s in cands)
    assert not any(k.half_issue for k in FAMILY.packaged((9, 0)))
    entry = dict(dtype="f16", bits=4, zero_mode="int", group_size=128, experts=128, top_k=8, n=1536, k=2048,
                 stage="w13", tokens=256, schedule="moe_sm90s:w13_t256x32x128_s0_hi_p", us=90.0)
    prof = Profile({"name": "x"}, {})
    prof.add_grouped(entry)
    names = {k.kernel_name for f, k in selectable_for((9, 0), 132, prof, shapes=((4096, 4096),), m_buckets=(1,),
                                                      grouped=True) if f is FAMILY}
    assert "mg_moe_sm90s_f16_u4_t256x32x128_s0_hi" in names  # named by the profile: packaged
    assert "mg_moe_sm90s_f16_u4_t256x64x128_s0_hi" not in names


def test_staged_epilogue_takes_ring_stages_one_k_slice_and_rows_of_16_bytes():
    """``_se``: the buffer (TN rows of 2 x 64 + 16 bytes a consumer warpgroup) beside fewer ring stages, named by its
    schedule, rendered with its flag and pitch check, one K slice, N a multiple of 8, and in a kernel
    package only where a profile names it."""
    c = MoeSm90sConfig.from_schedule("w2_t256x128x64_s0_se_p_f")
    assert c.staged and c.persistent and c.combine and c.kernel_name == "mg_moe_sm90s_f16_u4_t256x128x64_s0_se"
    plain = MoeSm90sConfig(tile=(256, 128, 64))
    assert c.extra_smem_bytes == 4 * 128 * (2 * 64 + 16) and c.pipeline_stages == 5 < plain.pipeline_stages == 8
    assert c.smem_bytes == c.dense.smem_bytes + c.extra_smem_bytes <= 232448
    src = FAMILY.render(c)
    assert "Geometry<4, 256, 128, 64, 5, 1, 1, false, true, false, 1, false, false, true>" in src
    assert "static_assert(Geo::kStagedPitch == 2 * 64 + 16," in src
    assert "false, false, false>" in FAMILY.render(plain)
    with pytest.raises(ValueError, match="one K slice"):
        MoeSm90sConfig(tile=(256, 128, 64), staged=True, splits=2)
    ok, why = FAMILY.can_implement(c.replace(stage="w2", combine=False), _problem(stage="w2", h=4100))
    assert not ok and "multiple of 8" in why and "_se" in why
    assert FAMILY.can_implement(c.replace(combine=False), _problem(stage="w2")) == (True, "")
    assert not any(k.staged for k in FAMILY.packaged((9, 0)))
    # Profile candidates for the down stage alone (gate|up measured slower with it), one K slice.
    down = candidate_schedules(_problem(tokens=4096, top_k=8, experts=128, h=2048, inter=768, stage="w2"), 132)
    up = candidate_schedules(_problem(tokens=4096, top_k=8, experts=128, h=2048, inter=768), 132)
    assert {"w2_t256x96x128_s0_se", "w2_t256x96x128_s0_se_p", "w2_t256x128x64_s0_se_p"} <= set(down)
    assert not any("_se" in s for s in up) and not any("_se_split" in s or "_se" in s and s.endswith("_f") for s in down)


def test_can_implement_reasons():
    c = MoeSm90sConfig()
    assert FAMILY.can_implement(c, _problem()) == (True, "")
    ok, why = FAMILY.can_implement(c, _problem(stage="w2"))
    assert not ok and "w13 kernel" in why
    assert FAMILY.can_implement(c.replace(bits=8), _problem(bits=8)) == (True, "")
    ok, why = FAMILY.can_implement(c.replace(bits=8, tile=(128, 32, 128)), _problem(bits=8))
    assert ok  # any tile the dense rules take runs; the catalog holds three for int8
    ok, why = FAMILY.can_implement(c, _problem(inter=1028))
    assert not ok and "multiple of 16" in why
    ok, why = FAMILY.can_implement(c.replace(stage="w2"), _problem(stage="w2", inter=1028))
    assert not ok and "K=1028 is not a multiple of 8" in why
    ok, why = FAMILY.can_implement(c, _problem(group_size=96))
    assert not ok and "group size 96" in why
    ok, why = FAMILY.can_implement(c, _problem(gate_up=False))
    assert not ok and "interleaved" in why
    assert FAMILY.heuristic(_problem(), 132) is None  # profile-only


def test_candidates_follow_the_rows_per_expert():
    """Mixtral at 16 tokens (4 pairs per expert): the 16-row tiles only; Qwen3 at 256 tokens (~16
    per routed expert): up to 32 rows; none outside 2..4096 tokens. A K split where the routed
    experts' tiles leave SMs idle."""
    mix = candidate_schedules(_problem(), 132)
    assert mix and all("x16x" in s for s in mix)
    qwen = candidate_schedules(_problem(tokens=256, top_k=8, experts=128, h=2048, inter=768), 132)
    assert {MoeSm90sConfig.from_schedule(s).tile[1] for s in qwen} == {16, 32}
    assert candidate_schedules(_problem(tokens=1), 132) == [] == candidate_schedules(_problem(tokens=8192), 132)
    # Prefill (Qwen3 at 4096 tokens, ~256 rows per expert): the 64- and 128-row token tiles.
    pre = candidate_schedules(_problem(tokens=4096, top_k=8, experts=128, h=2048, inter=768), 132)
    assert {MoeSm90sConfig.from_schedule(s).tile[1] for s in pre} == {64, 80, 96, 112, 128}
    # Mixtral's down at 2 tokens: ~3.5 routed experts x 32 row tiles = 112 CTAs, on 264 SMs a split of 2.
    assert "w2_t128x16x128_s0_split2" in candidate_schedules(_problem(tokens=2, stage="w2"), 264)


def test_library_families_render_one_routing_source():
    """moe_sm90a and moe_sm90s carry the same routing kernels and C entry points, rendered from
    templates/common/moe_route_lib.j2: the same text in both libraries (the activation type aside)."""
    from mixed_gemm.kernels.moe_sm90a import FAMILY as SM90A
    from mixed_gemm.kernels.moe_sm90a.catalog import default_catalog as sm90a_catalog

    srcs = [FAMILY.render(default_catalog()[0]), SM90A.render(sm90a_catalog()[0])]
    blocks = []
    for src in srcs:
        for name in ("mg_combine_k(", "mg_route_count(", "mg_route_scatter(", "mg_gather_k(", "int mg_combine(",
                     "int mg_route(", "int mg_gather(", '"mg_combine_k"', '"mg_gather_k"'):
            assert src.count(name) == 1, name
        start = src.index("// After the down GEMM: y[t] = sum_j")
        blocks.append(src[start:src.index("int mg_gather(")])
    assert blocks[0].replace("s90::", "mixed_gemm::sm90a::") == blocks[1]
