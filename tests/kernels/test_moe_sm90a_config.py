"""The moe_sm90a (grouped wgmma MoE) family's config, rendering, ABI mirror, heuristics, candidates,
can_implement reasons, and where ``moe`` asks it (CPU)."""
import pytest
import torch

from mixed_gemm.kernels import GROUPED_FAMILIES, MoeProblem, family, parse_schedule, qualified
from mixed_gemm.kernels.moe_sm90a import FAMILY, MoeSm90aConfig, abi
from mixed_gemm.kernels.moe_sm90a.candidates import MANY_TOKENS, candidate_schedules
from mixed_gemm.kernels.moe_sm90a.catalog import MANY_TOKEN_KERNELS, TILES, kernels_for
from mixed_gemm.kernels.moe_sm90a.heuristics import MIN_REUSE, heuristic_config, reuse

# (E, top_k, H, I): Qwen3-30B-A3B, Mixtral, DeepSeek-V2-Lite (mixed_gemm/benchmark/moe.py)
PRESETS = ((128, 8, 2048, 768), (8, 2, 4096, 14336), (64, 6, 2048, 1408))


def _problem(stage="w13", tokens=256, top_k=2, experts=8, h=4096, inter=1024, **kw):
    n, k = (2 * inter, h) if stage == "w13" else (h, inter)
    base = dict(tokens=tokens, top_k=top_k, experts=experts, n=n, k=k, dtype="f16", bits=4, zero_mode="int",
                group_size=128, layout="sm90a", stage=stage, gate_up=True)
    return MoeProblem(**dict(base, **kw))


@pytest.mark.parametrize("schedule", ["w13_t128x64x64_s0", "w2_t128x32x64_s0", "w2_t256x128x128_s4",
                                      "w13_t128x256x64_s0_c2", "w2_t128x128x64_s0_c2_rn", "w13_t256x128x64_s0_rn"])
def test_schedule_round_trip_and_names(schedule):
    c = MoeSm90aConfig.from_schedule(schedule, dtype="bf16", bits=8, zero_mode="float")
    assert c.schedule == schedule and qualified(c) == f"moe_sm90a:{schedule}"
    assert parse_schedule(qualified(c), dtype="bf16", bits=8, zero_mode="float") == c
    k = c.kernel
    # The stage and the raster order are launch-time choices: one binary serves both.
    assert (k.stage, k.zero_mode, k.raster) == ("w13", "int", "m") and k.kernel == k
    assert (c.cluster == 2) == ("_c2" in schedule) and (c.raster == "n") == schedule.endswith("_rn")
    assert c.kernel_name == k.kernel_name == "mg_moe_sm90a_bf16_u8_" + schedule.split("_", 1)[1].replace("_rn", "")
    assert c.name == f"mg_moe_sm90a_bf16_u8_zfloat_{schedule}"
    assert family("moe_sm90a") is FAMILY and GROUPED_FAMILIES[0] is FAMILY  # asked before moe_gemv
    for bad in ("t128x64x64_s0", "w13_t128x64x64", "w13_s2_w4x1_u8", "w13_t128x64x64_s0_rm_c2", "w13_t128x64x64_s0_rk"):
        with pytest.raises(ValueError, match="not a moe_sm90a schedule"):
            MoeSm90aConfig.from_schedule(bad)
    # One spelling per config: the defaults (cluster 1, raster m) are left out of the name.
    for other in ("w13_t128x64x64_s0_c1", "w13_t128x64x64_s0_rm", "w13_t128x64x64_s0_c1_rn"):
        with pytest.raises(ValueError, match="not a moe_sm90a schedule's spelling"):
            MoeSm90aConfig.from_schedule(other)


@pytest.mark.parametrize("kw, rule", [
    (dict(stage="w3"), r"stage must be one of \('w13', 'w2'\)"),
    (dict(tile=(64, 64, 64)), "tile M .* must be 128 or 256"),
    (dict(tile=(128, 24, 64)), "tile N .* multiple of 16"),
    (dict(tile=(128, 64, 32)), "tile K must be 64 or 128"),
    (dict(stages=1), "stages must be 0"),
    (dict(bits=3), "bits must be one of"),
    (dict(cluster=4), r"cluster \(CTAs along the weight rows\) must be one of \(1, 2\)"),
    (dict(raster="k"), r"raster must be one of \('m', 'n'\)"),
])
def test_config_rules_name_the_field(kw, rule):
    with pytest.raises(ValueError, match=rule):
        MoeSm90aConfig(**kw)


def test_catalog_renders_the_grouped_kernel():
    cat = FAMILY.catalog()
    assert len(cat) == 32 and len({c.kernel_name for c in cat}) == 32 and all(c.kernel == c for c in cat)
    assert {(c.tile, c.cluster) for c in cat} == set(kernels_for(4)) and {c.tile for c in cat if c.bits == 8} == set(TILES)
    # The many-token kernels are int4's (the weights measured), per activation dtype.
    assert {(c.dtype, c.tile, c.cluster) for c in cat if c.cluster == 2 or c.tile[0] == 256} == {
        (d, t, k) for d in ("f16", "bf16") for t, k in MANY_TOKEN_KERNELS}
    src = FAMILY.render(cat[0])
    assert '#include "moe_sm90a/grouped_sm90a.cuh"' in src
    assert f"GroupedGemm<cutlass::half_t, cutlass::int4b_t, {', '.join(map(str, cat[0].tile))}, 0, 1>" in src
    c2 = next(c for c in cat if c.cluster == 2)
    assert f"{', '.join(map(str, c2.tile))}, 0, 2>" in FAMILY.render(c2)
    # The raster order is a launch argument (mg_run's raster_n), not a kernel: the same source.
    assert FAMILY.render(c2.replace(raster="n")) == FAMILY.render(c2) and "int raster_n" in src
    assert f"{{{abi.ABI_VERSION}, " in src and "mg_strides" in src and "mg_run" in src
    # The routing (counting sort), the row gather and the per-expert arrays are the library's kernels.
    from mixed_gemm.kernels.moe_route import SORT_ARGS_BYTES
    assert f"sizeof(mixed_gemm::moe_sort::SortArgs) == {SORT_ARGS_BYTES}" in src
    for fn in ("mg_route_count", "mg_route_scatter", "mg_gather", "mg_pointers", "int mg_route("):
        assert fn in src
    assert set(abi.SIGNATURES) >= {"mg_route", "mg_gather", "mg_pointers"}
    assert FAMILY.arch_flags == ("-gencode=arch=compute_90a,code=sm_90a",) and FAMILY.output == "shared"
    assert abi.STRIDE_FIELDS == ("layout_w_bytes", "stride_x_bytes", "stride_s_bytes", "stride_y_bytes")
    assert abi.INFO_FIELDS[6:10] == ("tile_m", "tile_n", "tile_k", "cluster_m")
    assert "G::kClusterM, (long long)sizeof(G::Shape3)" in src  # mg_info's order, mirrored


def test_can_implement_reasons():
    c = MoeSm90aConfig(stage="w13")
    assert FAMILY.can_implement(c, _problem()) == (True, "")
    assert FAMILY.can_implement(c, _problem(group_size=4096)) == (True, "")  # per-channel (group = K)
    ok, why = FAMILY.can_implement(c, _problem(group_size=32))
    assert not ok and "group size 32 is not a multiple of the tile's K=64" in why
    ok, why = FAMILY.can_implement(c, _problem(stage="w2"))
    assert not ok and "is the w13 kernel, the problem is the w2 projection" in why
    ok, why = FAMILY.can_implement(c, _problem(h=4100))
    assert not ok and "multiples of 8" in why
    ok, why = FAMILY.can_implement(c, _problem(layout="sm80"))
    assert not ok and "layout" in why


def test_heuristic_passes_below_the_reuse_and_widens_the_tile():
    assert heuristic_config(_problem(tokens=4)) is None  # 8 pairs on ~5 experts: moe_gemv's
    mixtral = [heuristic_config(_problem(tokens=t, experts=8, top_k=2)) for t in (64, 256, 4096)]
    assert [c and c.tile[1] for c in mixtral] == [32, 128, 256]  # 16, 64, 1024 pairs per expert
    for e, k, h, i in PRESETS:
        for t in (1, 4, 16, 64, 256, 4096):
            p = _problem(tokens=t, experts=e, top_k=k, h=h, inter=i)
            c = heuristic_config(p)
            assert (c is None) == (reuse(p) < MIN_REUSE)
            if c is not None:
                assert FAMILY.can_implement(c, p)[0] and c.kernel in FAMILY.catalog()
    assert candidate_schedules(_problem(stage="w2")) == [f"w2_t{m}x{n}x{k}_s0" for m, n, k in TILES]
    assert candidate_schedules(_problem(stage="w2", tokens=MANY_TOKENS - 1)) == candidate_schedules(_problem(stage="w2"))
    assert FAMILY.heuristic(object(), 132) is None and FAMILY.candidates(object(), 132) == []


def test_launcher_arrays_follow_the_stacked_weight(monkeypatch):
    """The per-expert pointer arrays step by one expert's bytes; the stride blobs mg_strides writes
    are replicated per expert as int32 words (built with fills: no host-to-device copy)."""
    from types import SimpleNamespace

    from mixed_gemm.kernels.moe_sm90a.launch import _Arrays

    e, n, k = 3, 64, 128
    w = SimpleNamespace(num_experts=e, n=n, k=k, b=torch.zeros(e, 8, 4, 32, dtype=torch.int32),
                        scales=torch.zeros(e, 1, 64, dtype=torch.float16),
                        zeros=torch.zeros(e, 1, 64, dtype=torch.float16))
    info = dict(layout_w_bytes=8, stride_x_bytes=8, stride_s_bytes=8, stride_y_bytes=4)

    class Lib:
        @staticmethod
        def mg_strides(blob, n_, n_pad, k_):
            assert (n_, n_pad, k_) == (n, 64, k)
            words = [n_pad // 16, 0, k_, 0, n_pad, 0, n_]
            for i, v in enumerate(words):
                blob[4 * i:4 * i + 4] = int(v).to_bytes(4, "little")

    a = _Arrays(Lib, info, w, torch.device("cpu"))
    assert a.w.tolist() == [w.b.data_ptr() + i * w.b[0].numel() * 4 for i in range(e)]
    assert a.s.tolist() == [w.scales.data_ptr() + i * 128 for i in range(e)]
    assert a.layouts_w.tolist() == [[4, 0]] * e and a.strides_x.tolist() == [[k, 0]] * e
    assert a.strides_s.tolist() == [[64, 0]] * e and a.strides_y.tolist() == [[n]] * e
    assert not hasattr(a, "shapes")  # per call: the library's mg_pointers kernel writes (N, T_e, K)


@pytest.mark.parametrize("stage", ["w13", "w2"])
def test_many_token_candidates(stage):
    """From MANY_TOKENS tokens on, the profiler also times the clusters of two and the 256-row tile,
    and every kernel with the routed-row tiles first; all of them catalog kernels (built by
    ``build --all``) that can run the presets' projections. The heuristic picks none of them."""
    for e, k, h, i in PRESETS:
        for t in (MANY_TOKENS, 4096):
            p = _problem(stage=stage, tokens=t, experts=e, top_k=k, h=h, inter=i)
            names = candidate_schedules(p)
            assert len(names) == len(set(names)) == 2 * len(kernels_for(4))
            configs = [MoeSm90aConfig.from_schedule(n) for n in names]
            assert {(c.tile, c.cluster, c.raster) for c in configs} == {
                (t_, c_, r) for t_, c_ in kernels_for(4) for r in ("m", "n")}
            assert all(c.stage == stage and c.kernel in FAMILY.catalog() for c in configs)
            assert all(FAMILY.can_implement(c, p) == (True, "") for c in configs)
            assert FAMILY.candidates(p, 132) == names
            h_ = heuristic_config(p)
            assert h_ is not None and (h_.cluster, h_.raster, h_.tile[0]) == (1, "m", 128)
        p8 = _problem(stage=stage, tokens=4096, experts=e, top_k=k, h=h, inter=i, bits=8)
        assert {MoeSm90aConfig.from_schedule(n, bits=8).tile for n in candidate_schedules(p8)} == set(TILES)


def test_many_token_kernels_follow_the_group_rules():
    """The new kernels keep the family's rules: a group must be a multiple of TK; clusters and the
    256-row tile refuse nothing a 128-row tile takes (a partial or odd last weight tile is TMA's zero
    fill, the cluster's partner CTA of an odd count a tile past the weight rows)."""
    for tile, cluster in MANY_TOKEN_KERNELS:
        c = MoeSm90aConfig(stage="w2", tile=tile, cluster=cluster)
        assert FAMILY.can_implement(c, _problem(stage="w2", tokens=4096, group_size=64))[0] == (tile[2] == 64)
        assert FAMILY.can_implement(c, _problem(stage="w2", tokens=4096, h=4104)) == (True, "")  # 32.06 weight tiles
        ok, why = FAMILY.can_implement(c, _problem(stage="w2", tokens=4096, group_size=32))
        assert not ok and f"group size 32 is not a multiple of the tile's K={tile[2]}" in why
