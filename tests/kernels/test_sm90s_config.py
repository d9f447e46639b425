"""The sm90s family without a GPU: config rules, names and schedules, the shared-memory mirror of
templates/sm90s/params.cuh, the catalog, can_implement's reasons, the split factor chosen per
shape, the profiler's candidates, the heuristic's switch, and the cluster release's scope in the
compiled PTX."""
import re
import subprocess

import pytest

from mixed_gemm import _paths
from mixed_gemm.compile import cutlass_include_dir, find_nvcc
from mixed_gemm.kernels import FAMILIES, Problem, family, parse_schedule, qualified
from mixed_gemm.kernels.sm90s import FAMILY, SWITCH_ENV, Sm90sConfig
from mixed_gemm.kernels.sm90s.config import double_buffered
from mixed_gemm.kernels.sm90s.candidates import candidate_schedules
from mixed_gemm.kernels.sm90s.catalog import IN_FLIGHT, IN_FLIGHT_U8, default_catalog


def _problem(**kw):
    base = dict(m=16, n=4096, k=4096, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    return Problem(**dict(base, **kw))


def test_registered_first_reads_the_sm90a_layout_and_sets_none():
    assert family("sm90s") is FAMILY and FAMILIES[0] is FAMILY
    assert FAMILY.layout == "sm90a" and not FAMILY.sets_layout
    assert FAMILY.arch_flags == ("-gencode=arch=compute_90a,code=sm_90a",) and FAMILY.output == "shared"
    assert FAMILY.runs_on((9, 0)) == (True, "") and not FAMILY.runs_on((8, 0))[0] and not FAMILY.runs_on((10, 0))[0]


def test_names_schedules_and_round_trip():
    c = Sm90sConfig(dtype="bf16", tile=(128, 64, 128), decomposition="split", splits=4, zero_mode="float")
    assert c.schedule == "t128x64x128_c1x1_o1_s0_split4"
    assert c.kernel_name == "mg_sm90s_bf16_u4_t128x64x128_c1x1_o1_s0"
    assert c.name == "mg_sm90s_bf16_u4_zfloat_t128x64x128_c1x1_o1_s0_split4"
    assert c.kernel == Sm90sConfig(dtype="bf16", tile=(128, 64, 128))  # zero mode and split folded
    for sched in ("t128x16x128_c1x1_o2_s0_auto", "t128x256x64_c1x1_o1_s3_dp", "t128x32x128_c1x1_o1_s6_split16",
                  "t128x128x128_c2x1_o1_s0_ph_auto", "t128x64x128_c2x1_o1_s0_split3",
                  "t128x256x128_c4x1_o1_s0_dp", "t128x32x128_c4x1_o1_s0_ph_split2",
                  "t256x64x128_c1x1_o1_s0_sk", "t128x32x128_c1x1_o2_s0_hi_sk"):
        again = parse_schedule(f"sm90s:{sched}", dtype="f16", bits=8, zero_mode="sym")
        assert again.schedule == sched and qualified(again) == f"sm90s:{sched}" and again.bits == 8
    with pytest.raises(ValueError, match="is not an sm90s schedule"):
        Sm90sConfig.from_schedule("t128x64x128_coop_c1x1_s0_dp")


def test_in_flight_is_a_double_buffered_kernel_of_its_own():
    c = Sm90sConfig.from_schedule("t64x128x128_c1x1_o1_s0_ov_sk")
    assert c.in_flight and c.decomposition == "sk" and c.kernel.in_flight
    assert c.kernel_name == "mg_sm90s_f16_u4_t64x128x128_c1x1_o1_s0_ov" and c.schedule == "t64x128x128_c1x1_o1_s0_ov_sk"
    src = FAMILY.render(c)
    assert "Geometry<4, 64, 128, 128, 6, 1, 1, false, false, false, 1, false, true>" in src
    for kw in (dict(tile=(128, 256, 128)), dict(tile=(128, 64, 128), ctas_per_sm=2), dict(phased=True, cluster=(2, 1)),
               dict(tile=(256, 64, 128))):
        with pytest.raises(ValueError, match=r"in_flight \(_ov\) only with the double buffer"):
            Sm90sConfig(in_flight=True, **kw)
    ov = [k for k in default_catalog() if k.in_flight]
    assert len(ov) == 2 * (len(IN_FLIGHT) + len(IN_FLIGHT_U8)) and all(k.ctas_per_sm == 1 for k in ov)
    assert {k.bits for k in ov} == {4, 8}
    assert not any(k.in_flight for k in FAMILY.packaged((9, 0)))  # in a package where a profile names them
    assert "t64x128x128_c1x1_o1_s0_ov_auto" in candidate_schedules(256, 4096, 4096, 132)
    assert "t128x64x128_c2x1_o1_s0_ov_auto" in candidate_schedules(64, 4096, 4096, 132)


@pytest.mark.parametrize("kw,rule", [
    (dict(tile=(32, 64, 128)), "tile M"),
    (dict(tile=(64, 128, 128), cluster=(2, 1)), "tile M 64"),
    (dict(tile=(64, 128, 128), phased=True), "tile M 64"),
    (dict(tile=(64, 256, 128), ctas_per_sm=2), "two CTAs per SM"),
    (dict(tile=(256, 128, 128)), "tile M 256"),
    (dict(tile=(256, 256, 64)), "tile M 256"),
    (dict(tile=(256, 64, 128), ctas_per_sm=2), "tile M 256"),
    (dict(tile=(256, 64, 128), cluster=(2, 1)), "tile M 256"),
    (dict(tile=(256, 64, 128), phased=True), "tile M 256"),
    (dict(tile=(128, 40, 128)), "tile N"),
    (dict(tile=(128, 64, 32)), "tile K"),
    (dict(cluster=(2, 2)), "cluster"),
    (dict(cluster=(1, 4), decomposition="split", splits=2), r"cluster \(1, 4\) \(K slices\) is its own split factor"),
    (dict(cluster=(8, 1)), "cluster"),
    (dict(cluster=(3, 1)), "cluster"),
    (dict(tile=(128, 16, 128), cluster=(4, 1)), r"cluster \(4, 1\) needs tile N a multiple of 32"),
    (dict(phased=1), "phased"),
    (dict(tile=(128, 128, 128), ctas_per_sm=2), "two CTAs per SM only at TN <= 64"),
    (dict(stages=1), "stages"),
    (dict(decomposition="split"), "splits > 1 exactly"),
    (dict(decomposition="dp", splits=2), "splits > 1 exactly"),
    (dict(decomposition="split", splits=17), "splits must be in"),
    (dict(decomposition="stream"), "decomposition"),
    (dict(decomposition="sk", cluster=(1, 2)), r"\(K slices\) is its own split factor"),
    (dict(decomposition="sk", phased=True), r"stream-K \(sk\) only without a K cluster"),
    (dict(bits=3), "bits"),
    (dict(tile=(128, 256, 128), stages=4), "shared memory"),
    (dict(tile=(128, 16, 128), ctas_per_sm=2, stages=8), "shared memory"),
])
def test_rules_name_what_is_wrong(kw, rule):
    with pytest.raises(ValueError, match=rule):
        Sm90sConfig(**kw)


@pytest.mark.parametrize("tile,ctas,stages", [((128, 16, 128), 1, 8), ((128, 16, 128), 2, 7),
                                               ((128, 64, 128), 1, 8), ((128, 128, 128), 1, 5),
                                               ((128, 256, 128), 1, 3), ((128, 256, 64), 1, 6)])
def test_auto_stages_fill_the_shared_memory(tile, ctas, stages):
    c = Sm90sConfig(tile=tile, ctas_per_sm=ctas)
    assert c.pipeline_stages == stages
    assert c.smem_bytes <= {1: 227 * 1024, 2: 113 * 1024}[ctas]
    assert c.replace(stages=stages).smem_bytes == c.smem_bytes
    src = FAMILY.render(c)  # the kernel static_asserts the same number
    assert f"static_assert(Geo::kSmemBytes == {c.smem_bytes}," in src
    assert f"Geometry<4, 128, {tile[1]}, {tile[2]}, {stages}, {ctas}, 1, false>" in src


def test_cluster_and_phase_offset_are_compiled_in():
    c = Sm90sConfig(tile=(128, 128, 128), cluster=(2, 1), phased=True)
    assert c.schedule == "t128x128x128_c2x1_o1_s0_ph_auto"
    assert c.kernel_name == "mg_sm90s_f16_u4_t128x128x128_c2x1_o1_s0_ph"
    assert c.kernel_name != c.replace(phased=False).kernel_name != c.replace(cluster=(1, 1), phased=False).kernel_name
    assert c.smem_bytes == c.replace(cluster=(1, 1)).smem_bytes  # the same ring, half of x from the peer
    assert "Geometry<4, 128, 128, 128, 5, 1, 2, true>" in FAMILY.render(c)
    # Row tiles are launched in whole clusters: 33 row tiles take 34 CTAs per token tile and slice.
    assert c.tiles(16, 4224) == 34 and c.replace(cluster=(1, 1)).tiles(16, 4224) == 33
    assert c.tiles(200, 4096) == 64 and c.replace(tile=(128, 64, 128)).tiles(200, 4096) == 128


def test_four_cta_cluster():
    """c4x1: four row tiles share an x tile, each CTA loading TN/4 token rows (whole 8-row swizzle
    atoms: TN >= 32); the ring is c1x1's; row tiles launch in whole clusters of four."""
    c = Sm90sConfig(tile=(128, 64, 128), cluster=(4, 1))
    assert c.schedule == "t128x64x128_c4x1_o1_s0_auto" and c.kernel_name == "mg_sm90s_f16_u4_t128x64x128_c4x1_o1_s0"
    assert Sm90sConfig.from_schedule(c.schedule) == c
    assert c.smem_bytes == c.replace(cluster=(1, 1)).smem_bytes
    assert "Geometry<4, 128, 64, 128, 8, 1, 4, false>" in FAMILY.render(c)
    assert "Geometry<4, 128, 32, 128, 8, 1, 4, true>" in FAMILY.render(c.replace(tile=(128, 32, 128), phased=True))
    assert Sm90sConfig(tile=(128, 256, 128), cluster=(4, 1)).pipeline_stages == 3
    # 33 row tiles take 36 CTAs per token tile and slice (the last cluster: one tile in N, three past it),
    # 34, 35 and 36 row tiles too.
    for n in (4224, 4352, 4480, 4608):
        assert c.tiles(16, n) == 36
    assert c.tiles(64, 4096) == 32 and c.tiles(64, 4096 + 128) == 36 and c.tiles(200, 640) == 8 * 4
    assert c.launch_splits(64, 4096, 4096, 132) == 4      # 8B o: 4 slices of 32 row tiles, 128 CTAs
    assert c.launch_splits(64, 8192, 28672, 132) == 2     # 70B down: 2 slices of 64 row tiles
    # The launcher counts whole clusters that fit the GPCs (cudaOccupancyMaxActiveClusters x 4): with
    # 30 of them, 8B o takes 3 slices (96 CTAs in one wave), not 4 (128 CTAs, a second wave of 8).
    assert c.launch_splits(64, 4096, 4096, 132, slots=30 * 4) == 3


def test_four_consumer_warpgroups():
    """TM = 256: four consumer warpgroups behind one producer (640 threads), half the row tiles of
    TM = 128, a ring stage of twice the weight and scale bytes; compiled in as Geometry's TM."""
    c = Sm90sConfig(tile=(256, 64, 128))
    assert c.schedule == "t256x64x128_c1x1_o1_s0_auto" and Sm90sConfig.from_schedule(c.schedule) == c
    assert c.threads == 640 and Sm90sConfig().threads == 384
    assert c.stage_bytes == 64 * 128 * 2 + 256 * 64 + 2 * 4 * 256 * 2 and c.pipeline_stages == 6
    assert c.tiles(64, 8192) == 32 and c.tiles(128, 8192 + 128) == 66
    assert c.launch_splits(64, 8192, 28672, 132) == 4      # 70B down: 4 slices of 32 row tiles
    src = FAMILY.render(c)
    assert "Geometry<4, 256, 64, 128, 6, 1, 1, false>" in src and "__launch_bounds__(640, 1)" in src
    assert Sm90sConfig(tile=(256, 16, 128), bits=8).kernel_name == "mg_sm90s_f16_u8_t256x16x128_c1x1_o1_s0"


def test_catalog_covers_the_token_tiles_of_both_dtypes():
    cat = default_catalog()
    assert len({c.kernel_name for c in cat}) == len(cat)
    for dtype in ("f16", "bf16"):
        tns = {c.tile[1] for c in cat if c.dtype == dtype and c.bits == 4}
        assert tns == {16, 32, 64, 128, 256}
        assert any(c.dtype == dtype and c.bits == 8 for c in cat)
        # x multicast over 2x1 clusters from TN = 64 on, beside the c1x1 kernels, with and without
        # the phase offset, and over 4x1 clusters.
        for tn in (64, 128, 256):
            kinds = {(c.cluster, c.phased) for c in cat if c.dtype == dtype and c.bits == 4 and c.tile[1] == tn
                     and c.cluster[1] == 1}
            assert kinds == {((1, 1), False), ((2, 1), False), ((2, 1), True), ((4, 1), False)}
        assert any(c.dtype == dtype and c.bits == 8 and c.cluster == (2, 1) for c in cat)
        # Split-K as a 1xS cluster at the decode-batch token tiles.
        assert {(c.tile[1], c.cluster) for c in cat if c.dtype == dtype and c.bits == 4 and c.cluster[1] > 1} \
            >= {(16, (1, 2)), (16, (1, 4)), (32, (1, 4))}
    assert all(c == c.kernel and c.decomposition == "auto" for c in cat)


def test_k_cluster_is_its_own_split_factor_and_takes_shared_memory():
    c = Sm90sConfig.from_schedule("t128x16x128_c1x4_o1_s0_auto")
    assert c.cluster == (1, 4) and c.kernel_name == "mg_sm90s_f16_u4_t128x16x128_c1x4_o1_s0"
    assert c.launch_splits(16, 4096, 4096, 132) == 4 and c.launch_splits(16, 57344, 8192, 132) == 4
    assert c.reduce_bytes == 3 * 128 * 16 * 4
    plain = Sm90sConfig(tile=(128, 16, 128))
    assert c.smem_bytes == c.pipeline_stages * c.stage_bytes + c.reduce_bytes + 256 + 1024
    assert c.pipeline_stages <= plain.pipeline_stages
    assert Sm90sConfig(tile=(256, 16, 128), cluster=(1, 4)).threads == 640  # TM = 256 takes K clusters
    # No dp or stream-K candidate for a K cluster (its split factor is fixed).
    for s in candidate_schedules(16, 57344, 8192, 132):
        assert not ("_c1x2_" in s or "_c1x4_" in s) or s.endswith("_auto")


@pytest.mark.parametrize("g,k,ok", [(32, 4096, True), (64, 4096, True), (128, 4096, True), (256, 4096, True),
                                    (4096, 4096, True), (4000, 4000, True), (16, 4096, False), (96, 4032, False)])
def test_can_implement_group_sizes(g, k, ok):
    c = Sm90sConfig(tile=(128, 16, 128))
    got, why = FAMILY.can_implement(c, _problem(group_size=g, k=k))
    assert got is ok
    assert ok or f"group size {g}" in why


def test_can_implement_reasons():
    c = Sm90sConfig(tile=(128, 64, 128))
    ok, why = FAMILY.can_implement(c, _problem(k=4100, group_size=4100))
    assert not ok and "K=4100 is not a multiple of 8" in why
    ok, why = FAMILY.can_implement(c, _problem(layout="sm80"))
    assert not ok and "'sm90a' weight layout" in why
    ok, why = FAMILY.can_implement(c, _problem(dtype="bf16"))
    assert not ok and "bf16" in why
    # Any N and any M: rows are stored with bounds checks, M > TN loops token tiles.
    assert FAMILY.can_implement(c, _problem(n=4100, m=1000)) == (True, "")
    assert FAMILY.can_implement(c, _problem(layout="sm80+sm90a")) == (True, "")


def test_auto_splits_fill_the_sms():
    c = Sm90sConfig(tile=(128, 16, 128))
    assert c.launch_splits(16, 4096, 4096, 132) == 4        # 32 tiles -> 128 CTAs
    assert c.launch_splits(16, 14336, 4096, 132) == 1       # 112 tiles: a second slice is a second wave
    assert c.launch_splits(16, 4096, 14336, 132) == 4
    assert c.launch_splits(16, 57344, 8192, 132) == 1
    assert c.launch_splits(16, 1024, 256, 132) == 1         # 2 k-tiles: nothing to split
    two = Sm90sConfig(tile=(128, 16, 128), ctas_per_sm=2)
    assert two.launch_splits(16, 14336, 4096, 132) == 2     # 112 tiles on 264 slots
    assert c.replace(decomposition="dp").launch_splits(16, 4096, 4096, 132) == 1
    assert c.replace(decomposition="split", splits=3).launch_splits(16, 4096, 4096, 132) == 3
    for n in (1024, 4096, 6144, 14336, 28672):
        s = c.launch_splits(64, n, 8192, 132)
        assert 1 <= s <= 16 and c.k_tiles(8192) // s >= 2


def test_candidates_parse_and_fit_m():
    assert candidate_schedules(8, 4096, 4096, 132) == []
    # Past 512: the prefill tiles of the catalog, each with the split chosen per shape.
    for bits in (4, 8):
        prefill = candidate_schedules(4096, 4096, 4096, 132, bits=bits)
        assert prefill and all(s.endswith("_auto") for s in prefill)
        for s in prefill:
            config = Sm90sConfig.from_schedule(s, bits=bits)
            assert config.kernel in set(default_catalog()) and config.tile[1] * config.tile[0] >= 192 * 128
    for m in (9, 16, 33, 64, 100, 256, 512):
        scheds = FAMILY.candidates(_problem(m=m), 132)
        assert scheds
        tns = {Sm90sConfig.from_schedule(s).tile[1] for s in scheds}
        assert max(tns) >= min(m, 256) and len(tns) <= 2
        for s in scheds:
            config = Sm90sConfig.from_schedule(s)
            assert config.kernel in default_catalog()
    assert any(s.endswith("_dp") for s in candidate_schedules(64, 57344, 8192, 132))
    # Stream-K beside auto where the tiles are not whole waves (224 tiles of 256 rows on 132 SMs),
    # on Cx1 clusters too (streamed as one), never on a phased kernel or a K cluster.
    at64 = candidate_schedules(64, 57344, 8192, 132)
    assert "t256x64x128_c1x1_o1_s0_sk" in at64 and "t256x64x128_c1x1_o1_s0_auto" in at64
    assert "t128x64x128_c2x1_o1_s0_sk" in at64
    assert not any(s.endswith("_sk") and ("_ph" in s or "_c1x2" in s or "_c1x4" in s) for s in at64)
    # Not within one wave at memory-bound M (32 tiles of 8B o at TN = 64); from M = 256 on, where
    # the tensor work bounds the time, also within one wave (8B o: 64 tiles of 128 x 128).
    assert not any(s.endswith("_sk") for s in candidate_schedules(64, 4096, 4096, 132))
    assert "t128x128x128_c1x1_o1_s0_sk" in candidate_schedules(256, 4096, 4096, 132)
    # A 1xS cluster only where its slices fit one wave of whole clusters: 8B o at M=16 is 32 tiles,
    # x 4 slices = 128 CTAs, past the 120 of clusters of 4 at one CTA per SM, within the 248 at two.
    at16 = candidate_schedules(16, 4096, 4096, 132)
    assert "t128x16x128_c1x4_o1_s0_auto" not in at16 and "t128x16x128_c1x4_o2_s0_auto" in at16
    assert "t128x16x128_c1x2_o1_s0_auto" in at16
    at128 = candidate_schedules(128, 4096, 4096, 132)
    assert {"t128x128x128_c1x1_o1_s0_auto", "t128x128x128_c2x1_o1_s0_auto", "t128x128x128_c2x1_o1_s0_ph_auto",
            "t128x128x128_c4x1_o1_s0_auto"} <= set(at128)


def test_heuristic_passes_unless_switched_on(monkeypatch):
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    for m in (1, 16, 64, 256, 1024):
        assert FAMILY.heuristic(_problem(m=m), 132) is None
    monkeypatch.setenv(SWITCH_ENV, "1")
    assert FAMILY.heuristic(_problem(m=8), 132) is None and FAMILY.heuristic(_problem(m=257), 132) is None
    for m, tn in ((9, 16), (16, 16), (17, 32), (64, 64), (65, 128), (256, 256)):
        c = FAMILY.heuristic(_problem(m=m, dtype="bf16", zero_mode="offset"), 132)
        assert c.tile[1] == tn and c.dtype == "bf16" and c.zero_mode == "offset" and c.kernel in default_catalog()
        assert FAMILY.can_implement(c, _problem(m=m, dtype="bf16", zero_mode="offset"))[0]
    for m in (9, 64, 256):
        c = FAMILY.heuristic(_problem(m=m, bits=8), 132)
        assert c.bits == 8 and c.kernel in default_catalog()


@pytest.mark.nvcc
@pytest.mark.parametrize("cluster", [(2, 1), (4, 1)])
def test_cluster_release_is_not_a_gpu_fence(tmp_path, cluster):
    """A consumer warp releases each stage to the peer CTAs with a CTA-scope arrive. At cluster scope
    ptxas puts MEMBAR.ALL.GPU before it, on every warp's path to its next wgmma, every k-tile
    (docs/notes/serving-mainloop.md, "c2x1 measured: slower, and why")."""
    c = Sm90sConfig(tile=(128, 64, 128), cluster=cluster)
    src = tmp_path / "k.cu"
    src.write_text(FAMILY.render(c))
    ptx = tmp_path / "k.ptx"
    subprocess.run([str(find_nvcc()), "-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG",
                    f"-I{cutlass_include_dir()}", f"-I{_paths.templates_dir()}", "-arch=sm_90a", "--ptx",
                    "-o", str(ptx), str(src)], check=True, capture_output=True, text=True)
    arrives = re.findall(r"mbarrier\.arrive[.\w:]*shared::cluster\.b64", ptx.read_text())
    assert arrives and set(arrives) == {"mbarrier.arrive.release.cta.shared::cluster.b64"}


def test_refit_shrinks_a_borrowed_kernel_only_where_its_tiles_fall_short():
    """An entry borrowed from a larger shape: one step smaller (o2 -> o1, TM 256 -> 128, else half
    TN), a catalog kernel with the split factor re-chosen; unchanged on shapes as large or larger."""
    from mixed_gemm.kernels import Problem

    def at(n, k, m):
        return Problem(m=m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")

    big = at(3584, 3584, 256)
    c = Sm90sConfig.from_schedule("t128x128x128_c1x1_o1_s0_auto")
    assert FAMILY.refit(c, at(2048, 2048, 256), 132, big).schedule == "t128x64x128_c1x1_o1_s0_auto"
    assert FAMILY.refit(c, at(3072, 3072, 256), 132, big) is c          # 48 of 56 tiles: kept
    assert FAMILY.refit(c, at(8192, 8192, 256), 132, big) is c          # larger: kept
    o2 = Sm90sConfig.from_schedule("t128x32x128_c1x1_o2_s0_auto")
    assert FAMILY.refit(o2, at(2048, 2048, 64), 132, at(3584, 3584, 64)).schedule == "t128x32x128_c1x1_o1_s0_auto"
    rows = Sm90sConfig.from_schedule("t256x64x128_c1x1_o1_s0_split4")
    assert FAMILY.refit(rows, at(4096, 4096, 64), 132, at(8192, 28672, 64)).schedule == "t128x64x128_c1x1_o1_s0_auto"
    # int8 has no 128-token tile at TK = 64: the borrowed kernel stays.
    u8 = Sm90sConfig.from_schedule("t128x256x64_c1x1_o1_s0_auto", bits=8)
    assert FAMILY.refit(u8, at(2048, 2048, 256), 132, big) is u8
    # TM = 64 is the smallest row tile, and its half-TN kernel is not in the catalog: kept.
    one = Sm90sConfig.from_schedule("t64x128x128_c1x1_o1_s0_auto")
    assert FAMILY.refit(one, at(2048, 2048, 256), 132, at(4096, 4096, 256)) is one


def test_refit_keeps_stream_k_and_k_clusters_in_the_wave_regime_they_won_in():
    """A borrowed stream-K entry stays stream-K only on the side of one wave of tiles it was measured
    on; a borrowed 1xS cluster
    only where its slices of every tile still fit one wave of whole clusters (else the plain
    kernel, ``auto``): clusters of 4 keep 120 of 132 slots at one CTA per SM, 248 of 264 at two."""
    from mixed_gemm.kernels import Problem

    def at(n, k, m):
        return Problem(m=m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")

    sk = Sm90sConfig.from_schedule("t256x64x128_c1x1_o1_s0_sk")
    measured = at(57344, 8192, 64)
    assert FAMILY.refit(sk, measured, 132, measured) is sk                          # 224 tiles: kept
    assert FAMILY.refit(sk, at(49152, 8192, 64), 132, measured) is sk               # 192 tiles: kept
    half = at(28672, 8192, 64)                                                      # 112 tiles: one wave
    assert FAMILY.refit(sk, half, 132, measured).schedule == "t128x64x128_c1x1_o1_s0_auto"  # and shrunk
    assert FAMILY.refit(sk, half, 132, half) is sk                  # measured within one wave: kept there
    within = Sm90sConfig.from_schedule("t128x128x128_c1x1_o1_s0_sk")
    measured = at(4096, 4096, 256)                                                  # 64 tiles
    assert FAMILY.refit(within, at(6144, 4096, 256), 132, measured) is within       # 96 tiles: kept
    assert FAMILY.refit(within, at(28672, 4096, 256), 132, measured).schedule == "t128x128x128_c1x1_o1_s0_auto"
    kc = Sm90sConfig.from_schedule("t128x16x128_c1x4_o2_s0_auto")
    measured = at(6144, 4096, 16)
    assert FAMILY.refit(kc, measured, 132, measured) is kc                          # 48 x 4 of 264
    assert FAMILY.refit(kc, at(7936, 4096, 16), 132, measured) is kc                # 62 x 4 of 248
    assert FAMILY.refit(kc, at(8192, 4096, 16), 132, measured).schedule == "t128x16x128_c1x1_o2_s0_auto"
    kc1 = Sm90sConfig.from_schedule("t128x16x128_c1x4_o1_s0_auto")
    assert FAMILY.refit(kc1, at(3840, 4096, 16), 132, measured) is kc1             # 30 x 4 of 120
    assert FAMILY.refit(kc1, at(4096, 4096, 16), 132, measured).schedule == "t128x16x128_c1x1_o1_s0_auto"
    assert FAMILY.refit(kc, at(14336, 4096, 16), 132, measured).schedule == "t128x16x128_c1x1_o2_s0_auto"


def test_half_issue_only_with_one_fragment_set():
    """`_hi`: where the kernel has one fragment set (TN >= 32 at two CTAs per SM or TM = 256, and TN
    = 256) and no phase offset; compiled in (Geometry's HalfIssue) and the double buffer checked."""
    from mixed_gemm.kernels.sm90s.config import double_buffered

    c = Sm90sConfig.from_schedule("t128x32x128_c1x1_o2_s0_hi_auto")
    assert c.half_issue and c.schedule == "t128x32x128_c1x1_o2_s0_hi_auto"
    assert c.kernel_name == "mg_sm90s_f16_u4_t128x32x128_c1x1_o2_s0_hi" and c.kernel != c.replace(half_issue=False).kernel
    src = FAMILY.render(c)
    assert f"Geometry<4, 128, 32, 128, {c.pipeline_stages}, 2, 1, false, false, true>" in src
    assert "static_assert(Geo::kDoubleBuffer == false" in src
    assert "static_assert(Geo::kDoubleBuffer == true" in FAMILY.render(c.replace(half_issue=False, ctas_per_sm=1))
    assert ", false, false, true>" not in FAMILY.render(c.replace(half_issue=False))  # the plain kernel's line as before
    for schedule in ("t128x32x128_c1x1_o1_s0_hi_auto", "t128x16x128_c1x1_o2_s0_hi_auto",
                     "t256x16x128_c1x1_o1_s0_hi_auto"):  # double-buffered
        with pytest.raises(ValueError, match="half_issue"):
            Sm90sConfig.from_schedule(schedule)
    with pytest.raises(ValueError, match="half_issue"):
        Sm90sConfig(tile=(128, 256, 128), cluster=(2, 1), phased=True, half_issue=True)
    assert not double_buffered((128, 256, 128), 1) and Sm90sConfig(tile=(128, 256, 128), half_issue=True).half_issue
    assert double_buffered((128, 128, 128), 1) and not double_buffered((256, 64, 128), 1)


def test_half_issue_kernels_are_profile_candidates_only():
    half = [c for c in default_catalog() if c.half_issue]
    assert len(half) == 18 and all(not c.phased and c.cluster == (1, 1) for c in half)
    assert {c.replace(half_issue=False) for c in half} <= set(default_catalog())  # each beside its plain kernel
    assert "t128x32x128_c1x1_o2_s0_hi_auto" in candidate_schedules(32, 8192, 8192, 132)
    assert not any("_hi" in s for s in candidate_schedules(16, 8192, 8192, 132) if "x16x" in s)
    assert FAMILY.heuristic(_problem(m=32), 132) is None or not FAMILY.heuristic(_problem(m=32), 132).half_issue


def test_refit_keeps_half_issue_only_where_it_still_applies():
    from mixed_gemm.kernels import Problem

    def at(n, k, m):
        return Problem(m=m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")

    o2 = Sm90sConfig.from_schedule("t128x64x128_c1x1_o2_s0_hi_auto")  # -> o1: double-buffered, plain
    assert FAMILY.refit(o2, at(2048, 2048, 64), 132, at(3584, 3584, 64)).schedule == "t128x64x128_c1x1_o1_s0_auto"
    rows = Sm90sConfig.from_schedule("t256x64x128_c1x1_o1_s0_hi_split4")  # -> TM 128 at o1: plain
    assert FAMILY.refit(rows, at(4096, 4096, 64), 132, at(8192, 28672, 64)).schedule == "t128x64x128_c1x1_o1_s0_auto"


def test_three_consumer_warpgroups():
    """TM = 192: three consumer warpgroups at one CTA per SM; two fragment sets only where
    TN/2 + TK/2 <= 96 (Geometry's kDoubleBuffer, asserted in every rendered source)."""
    c = Sm90sConfig(tile=(192, 128, 64))
    assert c.threads == 512 and double_buffered(c.tile, 1)
    assert not double_buffered((192, 128, 128), 1) and double_buffered((192, 64, 128), 1)
    assert c.tiles(512, 6144) == 128                     # 32 row tiles x 4 token tiles: one wave of 132
    assert c.tiles(512, 4096) == 22 * 4                  # a ragged last row tile
    for bad in (dict(ctas_per_sm=2, tile=(192, 64, 128)), dict(cluster=(4, 1)), dict(phased=True),
                dict(tile=(192, 256, 64))):
        with pytest.raises(ValueError, match="tile M 192"):
            c.replace(**bad)
    Sm90sConfig(tile=(192, 128, 64), cluster=(1, 2))    # a K cluster is allowed, and a 2x1 one
    assert Sm90sConfig(tile=(192, 128, 128), cluster=(2, 1)).tiles(512, 6144) == 128
    # The profiler times them where TN = 64 / 128 is in play, and past M = 512 (PREFILL_SHAPES).
    assert "t192x128x128_c1x1_o1_s0_auto" in candidate_schedules(512, 6144, 4096, 132)
    assert "t192x64x128_c2x1_o1_s0_auto" in candidate_schedules(64, 6144, 4096, 132)
    assert "t192x128x128_c1x1_o1_s0_auto" in candidate_schedules(4096, 6144, 4096, 132)
    assert not any("t192x128x64_c1x2" in s for s in candidate_schedules(512, 6144, 4096, 132))  # 256 CTAs
