"""The sm90s family on an sm_90 GPU: every catalog kernel against the float32 reference
(element-wise, fresh seeded inputs, NaN-poisoned outputs) at M in {9, 16, 33, 64, 128, 256} on
model shapes; group sizes, zero modes, ragged shapes, decompositions, bias and residual on small
ones; stream-K on every kernel that takes it (tiles cut into K segments at CTA boundaries, more
CTAs than units, several token tiles); the cluster kernels' edges (C = 2, 4) and wave size; split-K
and stream-K determinism, tile counters left at zero, and CUDA-graph replay.

    python -m pytest -m gpu tests/kernels/test_sm90s_gpu.py
"""
import functools
import sys
from pathlib import Path

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import base, sm90s
from mixed_gemm.kernels.sm90s.config import Sm90sConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))  # weights.py: rel_err, seed_of
from test_sm90a_gpu import make_case  # noqa: E402  (the canonical weight of each zero kind)
from weights import deterministic_and_replayable, rel_err, seed_of  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or base.compute_capability(0) != (9, 0),
                                 reason="the sm90s family runs on compute capability 9.0 only")]

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
CATALOG = sm90s.FAMILY.catalog()
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K)
MS = (9, 16, 33, 64, 128, 256)


@functools.lru_cache(maxsize=None)
def weight(dtype, bits, zero, group, n, k):
    """(PackedWeight on the GPU, reference closure) for one weight; cached across the M sweep."""
    q, s, z, fmt, zm = make_case(bits, zero, group, n, k, seed_of("w", dtype, bits, zero, group, n, k))
    td = DTYPES[dtype]
    s_t, z_t = s.to(td), None if z is None else z.to(td)
    packed = mg.pack(q, s_t, z_t, format=fmt, bits=bits, group_size=group, zero_mode=zm)
    w = mg.prepack(*(None if t is None else t.cuda() for t in packed), format=fmt, bits=bits, group_size=group,
                   zero_mode=zm, dtype=td)
    assert w.layout == "sm90a"  # the H100's one copy: the layout sm90s reads
    qc, sc, zc = q.cuda(), s_t.cuda(), None if z_t is None else z_t.cuda()
    ref_mode = "offset" if zero == "offset" else "int"

    def ref(x, bias=None):
        return mg.reference.matmul(x, qc, sc, zc, group_size=group, bits=bits, bias=bias, zero_mode=ref_mode)

    return w, ref


def run_case(config, dtype, bits, zero, group, m, n, k, bias=False, residual=False):
    w, ref = weight(dtype, bits, zero, group, n, k)
    td = DTYPES[dtype]
    gen = torch.Generator(device="cuda").manual_seed(seed_of(config.schedule, dtype, bits, zero, group, m, n, k))
    x = torch.randn(m, k, device="cuda", generator=gen).to(td)
    b = torch.randn(n, device="cuda", generator=gen).to(td) if bias else None
    r = torch.randn(m, n, device="cuda", generator=gen).to(td) if residual else None
    cfg = config.replace(zero_mode=w.zero_mode)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=td)
    mg.matmul(x, w, bias=b, config=cfg, out=out, residual=r)
    want = ref(x, b)
    if r is not None:
        want = want + r.float()
    torch.cuda.synchronize()
    return out, want


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("config", CATALOG, ids=lambda c: c.kernel_name)
def test_every_catalog_kernel_on_model_shapes(config, n, k, m):
    """Each kernel at its default decomposition (the split factor chosen per shape); M beyond the
    token tile loops token tiles."""
    out, want = run_case(config, config.dtype, config.bits, "int", 128, m, n, k)
    assert rel_err(out, want, k) <= (2e-3 if config.dtype == "f16" else 1e-2)


def _small_cases():
    cases = []
    tiles = [c for c in CATALOG if c.dtype == "f16" and c.bits == 4]
    # (zero, group, N, K): N not a multiple of 16 or of the 128-row tile; K ending in a partial
    # k-tile (a partial group of k16 blocks, and for per-channel a partial k16 block).
    kinds = [("sym", 128, 200, 1152), ("int", 32, 1048, 800), ("float", 64, 4100, 832), ("offset", -1, 136, 776),
             ("int", 256, 520, 1280)]
    decomps = [dict(decomposition="dp"), dict(decomposition="auto"), dict(decomposition="split", splits=3),
               dict(decomposition="split", splits=7), dict(decomposition="sk")]
    i = 0
    for c in tiles:
        for zero, group, n, k in kinds:
            d = decomps[i % len(decomps)]
            if (d["decomposition"] == "sk" and c.phased) or c.cluster[1] > 1:
                d = dict(decomposition="auto")  # a 1xS cluster is its own split factor
            m = (7, 16, 77)[i % 3]
            tail = d["decomposition"] + (str(d["splits"]) if "splits" in d else "")
            cases.append(pytest.param(c.replace(**d), zero, group, n, k, m,
                                      id=f"{c.kernel_name}-{tail}-{zero}-g{group}-m{m}n{n}k{k}"))
            i += 1
    return cases


@pytest.mark.parametrize("config,zero,group,n,k,m", _small_cases())
def test_group_sizes_zero_modes_ragged_shapes_and_decompositions(config, zero, group, n, k, m):
    for dtype in ("f16", "bf16"):
        c = config.replace(dtype=dtype)
        out, want = run_case(c, dtype, 4, zero, group, m, n, k, bias=True, residual=m % 2 == 1)
        assert rel_err(out, want, k) <= (2e-3 if dtype == "f16" else 1e-2)


@pytest.mark.parametrize("config", [c for c in CATALOG if c.bits == 8], ids=lambda c: c.kernel_name)
def test_int8_kernels_with_zero_modes(config):
    for zero, group in (("int", 128), ("sym", -1), ("offset", 64)):
        d = dict(decomposition="split", splits=2) if config.cluster[1] == 1 else {}  # a 1xS cluster: its own
        out, want = run_case(config.replace(**d), config.dtype, 8, zero, group, 40, 1040, 2048,
                             bias=True)
        assert rel_err(out, want, 2048) <= (2e-3 if config.dtype == "f16" else 1e-2)


STREAM_K = [c.replace(decomposition="sk") for c in CATALOG if c.cluster[1] == 1 and not c.phased]
# (N, K, M): 32 tiles x 32 k-tiles over one wave (several segments a tile); 112 tiles x 2 token
# tiles (M past TN); 1.7 tiles a CTA; fewer units than CTAs (a grid of one CTA a unit); ragged N, K;
# a data-parallel first wave wider than the rest's units (272 or 136 tiles of 2 k-tiles).
STREAM_K_SHAPES = ((4096, 4096, 64), (14336, 4096, 33), (28672, 4096, 16), (136, 800, 7), (1048, 800, 77),
                   (34816, 256, 16))


@pytest.mark.parametrize("n,k,m", STREAM_K_SHAPES, ids=[f"m{m}n{n}k{k}" for n, k, m in STREAM_K_SHAPES])
@pytest.mark.parametrize("config", STREAM_K, ids=lambda c: c.kernel_name)
def test_stream_k_on_every_kernel_that_takes_it(config, n, k, m):
    out, want = run_case(config, config.dtype, config.bits, "int", 128 if k % 128 == 0 else 32, m, n, k,
                         bias=m % 2 == 1)
    assert rel_err(out, want, k) <= (2e-3 if config.dtype == "f16" else 1e-2)


# A Cx1 cluster streams as one (its C row tiles over the same k ranges): 8B q|k|v at M = 256 and
# 512 (96 or 48 cluster tiles of 2 x 128 rows on 66 clusters: segments cut inside tiles, two a
# stream), and 70B o at M = 64 (a data-parallel wave, then ranges).
STREAM_K_CLUSTER = [c for c in STREAM_K if c.cluster[0] > 1]
STREAM_K_CLUSTER_SHAPES = ((6144, 4096, 256), (6144, 4096, 512), (8192, 8192, 64))


@pytest.mark.parametrize("n,k,m", STREAM_K_CLUSTER_SHAPES, ids=[f"m{m}n{n}k{k}" for n, k, m in STREAM_K_CLUSTER_SHAPES])
@pytest.mark.parametrize("config", STREAM_K_CLUSTER, ids=lambda c: c.kernel_name)
def test_stream_k_over_row_clusters(config, n, k, m):
    out, want = run_case(config, config.dtype, config.bits, "int", 128, m, n, k, bias=True, residual=m == 256)
    assert rel_err(out, want, k) <= (2e-3 if config.dtype == "f16" else 1e-2)


K_CLUSTER = [c for c in CATALOG if c.cluster[1] > 1]
# (N, K, M): K of 3 k-tiles (a 1x4 cluster's last slice idle), 7 k-tiles (uneven slices), several
# token tiles and ragged N; 8B o at one token tile.
K_CLUSTER_SHAPES = ((1048, 320, 33), (1048, 800, 77), (4096, 4096, 16))


@pytest.mark.parametrize("n,k,m", K_CLUSTER_SHAPES, ids=[f"m{m}n{n}k{k}" for n, k, m in K_CLUSTER_SHAPES])
@pytest.mark.parametrize("config", K_CLUSTER, ids=lambda c: c.kernel_name)
def test_k_slices_summed_in_shared_memory(config, n, k, m):
    out, want = run_case(config, config.dtype, config.bits, "int", 32, m, n, k, bias=True,
                         residual=m % 2 == 1)
    assert rel_err(out, want, k) <= (2e-3 if config.dtype == "f16" else 1e-2)


@pytest.mark.parametrize("schedule", ["t128x16x128_c1x1_o1_s0_split8", "t128x64x128_c1x1_o1_s0_auto",
                                      "t128x16x128_c1x4_o1_s0_auto", "t256x16x128_c1x4_o1_s0_auto",
                                      "t128x16x128_c1x1_o2_s0_sk", "t256x64x128_c1x1_o1_s0_sk",
                                      "t128x128x128_c2x1_o1_s0_sk", "t128x64x128_c4x1_o1_s0_sk",
                                      "t128x64x128_c2x1_o1_s0_ov_split4", "t64x128x128_c1x1_o1_s0_ov_sk",
                                      "t128x16x128_c1x1_o2_s0_split4", "t128x64x128_c2x1_o1_s0_split4",
                                      "t128x128x128_c2x1_o1_s0_ph_split3", "t128x64x128_c4x1_o1_s0_split4",
                                      "t128x128x128_c4x1_o1_s0_ph_split3", "t256x64x128_c1x1_o1_s0_split4",
                                      "t256x16x128_c1x1_o1_s0_split8"])
def test_split_k_is_deterministic_counters_reset_and_graphs_replay(schedule):
    """Split-K partials (and stream-K segments) are summed in slice order: bit-identical results,
    across eager calls and CUDA-graph replays (the tile counters are left at zero for the next
    launch)."""
    w, ref = weight("f16", 4, "int", 128, 2048, 4096)
    cfg = Sm90sConfig.from_schedule(schedule)
    x = torch.randn(24, 4096, device="cuda").half()
    first = deterministic_and_replayable(x, w, cfg)
    assert rel_err(first, ref(x), 4096) <= 2e-3
    for m in (24, 20, 24, 3):  # new M in the launcher's bucket, and back: parameters re-encoded
        x = torch.randn(m, 4096, device="cuda").half()
        assert rel_err(mg.matmul(x, w, config=cfg), ref(x), 4096) <= 2e-3


@pytest.mark.parametrize("config", [c for c in CATALOG if c.cluster[0] > 1 and c.dtype == "f16"],
                         ids=lambda c: c.kernel_name)
def test_cluster_edges(config):
    """Cx1 clusters (C = 2, 4): row tiles not a multiple of C (the last cluster holds 1, 2 or 3 row
    tiles in N; its other CTAs lie past N, load only their part of x for their peers and store
    nothing), token parts past M (M below TN/C: every CTA but the first has its x box wholly out of
    bounds; a second token tile of 5 rows), one k-tile per slice (the producers' tails with fewer
    k-tiles than stages), and many slices."""
    tn, c = config.tile[1], config.cluster[0]
    # (M, N, K, decomposition); N in row tiles (last cluster, C = 4 | C = 2): 9 (1 | 1), 33 (1 | 1),
    # 3 (3 | 1), 5 (1 | 1), 10 with a partial tenth (2 | 2, even), 11 with a partial eleventh (3 | 1).
    for m, n, k, d in ((tn // c - 3, 1152, 1024, dict(decomposition="dp")),
                       (tn + 5, 4224, 512, dict(decomposition="split", splits=4)),
                       (tn, 384, 2048, dict(decomposition="split", splits=16)),
                       (3, 640, 256, dict(decomposition="auto")),
                       (tn // c + 5, 1272, 768, dict(decomposition="split", splits=3)),
                       (tn // 2 + 1, 1400, 1024, dict(decomposition="dp"))):
        out, want = run_case(config.replace(**d), "f16", config.bits, "int", 128, max(m, 1), n, k, bias=True,
                             residual=True)
        assert rel_err(out, want, k) <= 2e-3, (m, n, k, d)


@pytest.mark.parametrize("config", [c for c in CATALOG if c.cluster != (1, 1) and c.dtype == "f16" and c.bits == 4
                                    and not c.phased], ids=lambda c: c.kernel_name)
def test_cluster_slots_are_whole_clusters_on_the_sms(config):
    """The launcher's wave (the split factor of ``auto``) counts the clusters that fit the GPCs at
    once, C x S CTAs each: at most one CTA per SM. Printed (``-s``): the number the c4x1 predictions of
    docs/notes/serving-mainloop.md assume to be 128, and the 1xS clusters' wave."""
    launcher = sm90s.FAMILY.launcher(config, 0)
    c = config.cluster[0] * config.cluster[1]
    print(f"{config.kernel_name}: {launcher.slots // c} clusters of {c} at once on {launcher.sms} SMs")
    assert 0 < launcher.slots <= launcher.sms * config.ctas_per_sm and launcher.slots % c == 0


def test_heuristic_leaves_sm90s_alone_without_the_switch(monkeypatch):
    """With no profile (the shipped one picks sm90s for shapes it measured, and the nearest profiled shape
    for others), the heuristic keeps its measured defaults unless the switch is on."""
    from mixed_gemm.select import selection
    from mixed_gemm.select.selection import clear_selection

    w, _ = weight("f16", 4, "int", 128, 3072, 2048)
    monkeypatch.delenv(sm90s.SWITCH_ENV, raising=False)
    monkeypatch.setattr(selection, "device_profile", lambda i: None)
    clear_selection()
    try:
        for m in (16, 64, 256):
            assert mg.explain(m, w).family.name != "sm90s"
    finally:
        clear_selection()
