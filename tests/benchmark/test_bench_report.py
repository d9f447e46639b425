"""`mixed-gemm bench`'s rows and tables on the CPU, from made-up timings: the limit, the share of it
reached and the floor share follow their definitions, and the columns line up with their headers."""
from __future__ import annotations

import pytest

from mixed_gemm.benchmark import limits, report
from mixed_gemm.benchmark.measure import WeightKind, row_of, weight_bytes

INT4 = WeightKind("f16", 4, 128, "int")
N = K = 4096
QBYTES = N * K // 2 + 2 * N * (K // 128) + N * (K // 128) // 2  # codes, fp16 scales, 4-bit zeros


def _row(m, t_mg, t_fp, **extra):
    row = row_of("llama3-8b/o", N, K, m, INT4, t_mg, t_fp, "gemv:m8_s1_w1x8_u16_ds", bandwidth=2.4e12)
    row.update(extra)
    return row


def test_defaults_cover_decode_serving_and_prefill():
    assert limits.DEFAULT_MS == "1,16,32,64,128,256,512,4096"
    assert (limits.PEAK_BANDWIDTH, limits.DENSE_FLOPS) == (3.0e12, 740e12)


def test_row_limit_and_shares_at_a_memory_bound_m():
    floor = QBYTES / 3.0e12
    assert weight_bytes(N, K, INT4) == QBYTES
    assert weight_bytes(N, K, WeightKind("f16", 4, 128, "sym")) == QBYTES - N * (K // 128) // 2
    r = _row(16, t_mg=2 * floor, t_fp=16.8e-6)
    assert r["speedup"] == pytest.approx(16.8e-6 / (2 * floor))
    assert r["limit"] == pytest.approx(16.8e-6 / floor)  # the bytes bound: 2.9 µs > 0.7 µs of flops
    assert r["of_limit"] == pytest.approx(0.5)
    assert r["floor_share"] == pytest.approx(0.5)
    assert r["copy_share"] == pytest.approx((QBYTES + 2 * 16 * (K + N)) / 2.4e12 / (2 * floor))
    assert r["tflops"] == pytest.approx(2 * 16 * N * K / (2 * floor) / 1e12)


def test_row_limit_at_a_math_bound_m():
    math_s = 2 * 4096 * N * K / 740e12
    r = _row(4096, t_mg=math_s / 0.9, t_fp=1.1 * math_s)
    assert r["limit"] == pytest.approx(1.1)
    assert r["of_limit"] == pytest.approx(0.9)
    assert r["floor_share"] == pytest.approx(QBYTES / 3.0e12 / (math_s / 0.9))


def test_table_columns_line_up_with_the_header():
    floor = QBYTES / 3.0e12
    rows = [_row(16, 2 * floor, 16.8e-6, tinygemm_us=20.0, tinygemm_speedup=0.84, humming_us=7.5,
                 humming_speedup=2.24, gemlite_error="gemlite: gemlite is not installed (pip install gemlite); skipped")]
    head, sep, line = report.table(rows, compare=True)
    cells = [c.strip() for c in line.strip("|").split("|")]
    names = [c.strip() for c in head.strip("|").split("|")]
    assert len(names) == len(cells) == sep.count("---")
    got = dict(zip(names, cells))
    assert got["M"] == "16" and got["mg µs"] == "5.8" and got["fp16 µs"] == "16.8"
    assert got["speedup"] == "2.89x" and got["limit"] == "5.78x" and got["of limit"] == "50%"
    assert got["floor share (weights at 3.0 TB/s)"] == "50%"
    assert got["schedule"] == "gemv:m8_s1_w1x8_u16_ds"
    assert (got["tinygemm µs"], got["tinygemm speedup"]) == ("20.0", "0.84x")
    assert (got["gemlite µs"], got["gemlite speedup"]) == ("-", "-")
    assert (got["humming µs"], got["humming speedup"]) == ("7.5", "2.24x")
    assert report.table(rows, compare=False)[0].count("|") == 13  # no peer columns


def test_summary_geomeans_and_notes():
    floor = QBYTES / 3.0e12
    rows = [_row(16, 2 * floor, 16.8e-6, humming_speedup=2.0),
            _row(16, 4 * floor, 16.8e-6, humming_speedup=8.0,
                 humming_error="humming: output differs from mg.matmul's by 3.0% (relative)"),
            _row(64, 2 * floor, 16.8e-6)]
    head, _, m16, m64 = report.summary(rows, [16, 64, 256], compare=True)
    assert head.startswith("| M | mg geomean speedup over fp16 | geomean limit | of limit | min floor share |")
    speedup = 16.8e-6 / (floor * 8 ** 0.5)
    assert m16 == (f"| 16 | {speedup:.2f}x | {16.8e-6 / floor:.2f}x | 35% | 25% | - | - | 4.00x |")
    assert m64.endswith("| 50% | 50% | - | - | - |")
    assert report.notes(rows) == ["unavailable or failed: humming: output differs from mg.matmul's by 3.0% (relative)"]
    assert report.notes(rows[:1]) == []


def test_report_peers_follow_the_peer_libraries():
    from mixed_gemm.benchmark.peers import PEERS

    assert report.PEERS == tuple(p.name for p in PEERS)
