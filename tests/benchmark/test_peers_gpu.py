"""The bench's peers on a GPU: humming-kernels, built from mg's own codes, computes the product mg
computes (so its column times the same weight), and a small ``bench_problem`` with ``compare``
fills every column or a note. Skips what is not installed. Run: ``python -m pytest -m gpu`` here."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("zero_mode", ["int", "sym"])
def test_humming_multiplies_by_mgs_weight(zero_mode):
    import mixed_gemm as mg
    from mixed_gemm.benchmark import peers
    from mixed_gemm.benchmark.measure import WeightKind
    from mixed_gemm.profiler.workload import random_weights

    kind = WeightKind("f16", 4, 128, zero_mode)
    why = peers.Humming().unavailable(kind)
    if why:
        pytest.skip(why)
    torch.manual_seed(0)
    n, k = 512, 1024
    ws = random_weights(n, k, bits=4, group_size=128, zero_mode=zero_mode, dtype="f16")
    layers = peers.Humming().build(n, k, kind, torch.float16, 2, ws)
    x = torch.randn(16, k, device="cuda").half()
    want = x.float() @ mg.dequantize(ws[0]).float().t()  # the weight mg's kernels multiply by
    for layer in layers:
        assert peers.rel_err(layer(x), want) <= peers.MAX_REL_ERR


def test_bench_problem_fills_peer_columns_or_notes():
    from mixed_gemm.benchmark import report
    from mixed_gemm.benchmark.measure import WeightKind, bench_problem

    rows = bench_problem("small", 1024, 1024, [1, 16], WeightKind(), bandwidth=3.0e12, compare=True)
    assert [r["m"] for r in rows] == [1, 16]
    for r in rows:
        assert r["us"] > 0 and r["limit"] > 0 and 0 < r["of_limit"] and 0 < r["floor_share"]
        for who in report.PEERS:
            assert (f"{who}_us" in r) or (f"{who}_error" in r), who
        if "humming_rel_err" in r:
            assert r["humming_rel_err"] <= 2e-2
    assert len(report.table(rows, compare=True)) == 4


def test_bench_problem_repeat_reports_the_medians_of_alternated_runs():
    import statistics

    from mixed_gemm.benchmark.measure import WeightKind, bench_problem

    (row,) = bench_problem("small", 1024, 1024, [16], WeightKind(), bandwidth=3.0e12, repeat=3)
    assert len(row["us_runs"]) == len(row["fp16_us_runs"]) == 3
    assert row["us"] == statistics.median(row["us_runs"]) and row["fp16_us"] == statistics.median(row["fp16_us_runs"])
    # The row divides seconds and stores microseconds: equal up to the last bits of the scaling.
    assert row["speedup"] == pytest.approx(row["fp16_us"] / row["us"], rel=1e-12)
