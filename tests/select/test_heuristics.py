"""The heuristics are data: check the table's invariants and a few decisions by hand."""
import pytest

from mixed_gemm.codegen import KernelConfig
from mixed_gemm.codegen.catalog import SHAPES
from mixed_gemm.select import HEURISTICS, heuristic_config, m_bucket
from mixed_gemm.select import heuristics as H


def test_m_bucket():
    assert [m_bucket(m) for m in (1, 2, 3, 16, 17, 1000, 4096)] == [1, 2, 4, 16, 32, 1024, 4096]


def test_table_is_sorted_unbounded_and_in_catalog():
    assert [row[0] for row in HEURISTICS] == sorted(row[0] for row in HEURISTICS)
    assert HEURISTICS[-1][0] >= 1 << 62
    for _, schedule in HEURISTICS:
        c = KernelConfig.from_schedule(schedule)
        assert c.method == "dequant_mm" or (c.tile, c.warps, c.stages) in set(SHAPES), schedule


@pytest.mark.parametrize("n,k,m,expect", [
    (4096, 4096, 1, ("fused", 4)),    # 64 column blocks: split to fill 132 SMs
    (10240, 8192, 16, ("fused", 4)),
    (28672, 4096, 1, ("none", 1)),       # 448 blocks already cover the GPU
    (4096, 256, 1, ("none", 1)),         # 2 k-tiles: nothing to split
    (4096, 4096, 512, ("fused", 4)),     # 128 tiles of 128x128 < 2 waves: split 4
    (8192, 8192, 512, ("fused", 3)),     # 256 tiles: 4 waves need 3 slices
    (8192, 8192, 1024, ("none", 1)),     # dequant_mm: no split-K at all

])
def test_split_k_decisions(n, k, m, expect, monkeypatch):
    monkeypatch.setattr(H, "sm_count", lambda device_index: 132)
    c = heuristic_config(m, n=n, k=k, bits=4, zero_mode="int")
    assert (c.split_k_mode, c.split_k) == expect


def test_tile_by_m(monkeypatch):
    monkeypatch.setattr(H, "sm_count", lambda device_index: 132)
    assert heuristic_config(1, n=8192, k=8192, bits=8, zero_mode="sym", dtype="bf16").tile == (16, 64, 128)
    assert heuristic_config(64, n=8192, k=8192, bits=4, zero_mode="int").tile == (64, 128, 64)
    assert heuristic_config(512, n=8192, k=8192, bits=4, zero_mode="int").tile == (128, 128, 64)
    big = heuristic_config(4096, n=8192, k=8192, bits=4, zero_mode="int", dtype="bf16")
    assert big.method == "dequant_mm" and big.schedule == "dequant_mm" and big.dtype == "bf16"
