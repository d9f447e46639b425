"""The sm80 heuristics are data: check the table's invariants and a few decisions by hand; and the
walk across families in select."""
import pytest

from mixed_gemm.kernels import Problem, base
from mixed_gemm.kernels.sm80.catalog import SHAPES
from mixed_gemm.kernels.sm80.config import Sm80Config
from mixed_gemm.kernels.sm80.heuristics import ROWS, heuristic_config
from mixed_gemm.select import heuristic_choice, m_bucket


def test_m_bucket():
    assert [m_bucket(m) for m in (1, 2, 3, 16, 17, 1000, 4096)] == [1, 2, 4, 16, 32, 1024, 4096]


def test_table_is_sorted_and_in_catalog():
    assert [row[0] for row in ROWS] == sorted(row[0] for row in ROWS)
    for _, schedule in ROWS:
        c = Sm80Config.from_schedule(schedule)
        assert (c.tile, c.warps, c.stages) in set(SHAPES), schedule


@pytest.mark.parametrize("n,k,m,expect", [
    (4096, 4096, 1, ("fused", 4)),    # 64 column blocks: split to fill 132 SMs
    (10240, 8192, 16, ("fused", 4)),
    (28672, 4096, 1, ("none", 1)),       # 448 blocks already cover the GPU
    (4096, 256, 1, ("none", 1)),         # 2 k-tiles: nothing to split
    (4096, 4096, 512, ("fused", 4)),     # 128 tiles of 128x128 < 2 waves: split 4
    (8192, 8192, 512, ("fused", 3)),     # 256 tiles: 4 waves need 3 slices
])
def test_split_k_decisions(n, k, m, expect):
    c = heuristic_config(m, n=n, k=k, bits=4, zero_mode="int", dtype="f16", sms=132)
    assert (c.split_k_mode, c.split_k) == expect


def test_tile_by_m_and_pass_above_the_table():
    kw = dict(n=8192, k=8192, sms=132)
    assert heuristic_config(1, bits=8, zero_mode="sym", dtype="bf16", **kw).tile == (16, 64, 128)
    assert heuristic_config(64, bits=4, zero_mode="int", dtype="f16", **kw).tile == (64, 128, 64)
    assert heuristic_config(512, bits=4, zero_mode="int", dtype="f16", **kw).tile == (128, 128, 64)
    assert heuristic_config(513, bits=4, zero_mode="int", dtype="f16", **kw) is None


def test_walk_takes_the_first_family_that_wants_and_can(monkeypatch):
    monkeypatch.setattr(base, "compute_capability", lambda i: (8, 0))
    p = dict(n=8192, k=8192, dtype="bf16", bits=4, zero_mode="int", group_size=128, layout="sm80")
    (fam, config), why = heuristic_choice(Problem(m=16, **p), 0)
    assert fam.name == "sm80" and config.tile == (16, 64, 128) and why == []
    (fam, config), _ = heuristic_choice(Problem(m=4096, **p), 0)
    assert fam.name == "dequant_mm" and config.dtype == "bf16"
    picked, why = heuristic_choice(Problem(m=16, **dict(p, layout="x")), 0)
    assert picked is None and len(why) == 5 and all("layout" in w for w in why[3:])
    assert why[2] == "gemv: its heuristic leaves M=16 to other families"
    assert why[0].startswith("sm90s: needs compute capability 9.0")
    assert why[1].startswith("sm90a: needs compute capability 9.0")


def _p(m, n, k):
    return Problem(m=m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm80")


def test_refit_saves_a_wave_or_keeps_the_measured_factor():
    from mixed_gemm.kernels.sm80.heuristics import refit_split_k

    def fit(config, m, n, k, measured=(4096, 14336)):
        return refit_split_k(config, _p(m, n, k), 132, _p(m, *measured))

    c = Sm80Config.from_schedule("t128x256x64_w2x4x1_s3_kparallel4")
    # 2 x 20 tiles x 4 slices = 160 blocks: 2 waves on 132 SMs; 3 slices make 120 blocks, 1 wave.
    assert fit(c, 256, 5120, 13824).split_k == 3
    assert fit(c, 256, 4096, 14336) is c          # 128 blocks: one wave already
    wide = Sm80Config.from_schedule("t64x256x64_w1x4x1_s3_kparallel4")
    assert fit(wide, 64, 5120, 5120) is wide        # 80 blocks: nothing to save
    thin = Sm80Config.from_schedule("t16x128x128_w1x1x4_s4_kfused8")
    assert fit(thin, 1, 5120, 13824) is thin        # decode tiles: 40 x 8 blocks fill the GPU
    # decode tiles on a shape of fewer N tiles keep the measured block count where the GPU would
    # be under-filled: 4096 rows = 32 tiles x 4 = 128 blocks; 2048 rows = 16 x 4 = 64 -> 8 slices
    assert fit(thin.replace(split_k=4), 1, 2048, 4096, (4096, 4096)).split_k == 8
