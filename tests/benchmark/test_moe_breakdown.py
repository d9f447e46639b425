"""`mixed-gemm bench --moe --breakdown` on the CPU: kernels of one mg.moe call (names as the profiler
reports them) assigned to stages, graph replays split from the profiler's events, and the tables."""
from __future__ import annotations

import pytest

from mixed_gemm.benchmark import moe_breakdown as bd

WHERE = "void at::native::vectorized_elementwise_kernel<4, at::native::where_kernel_impl(at::TensorIteratorBase&)::{lambda(bool, long, long)#1}>"
SORT = "void at::native::(anonymous namespace)::radixSortKVInPlace<-2, -1, 128, 32, long, long, unsigned int>(...)"
ONESWEEP = "void cub::CUB_300000_SM_900::detail::radix_sort::DeviceRadixSortOnesweepKernel<...>"
SEGMENTS = "void at::native::(anonymous namespace)::fill_index_and_segment_kernel<2, ...>"
COUNTS = ("void at::native::_scatter_gather_elementwise_kernel<128, 8, at::native::_cuda_scatter_gather_internal_kernel"
          "<true, long>::operator()<at::native::ReduceAdd>(...)::{lambda(int)#1}>(int, ...)")
SCAN = "void at::cuda::cub::detail::scan::DeviceScanKernel<...long...>"
GATHER = "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::Half, long, unsigned int, 2, 2, -2, true>(...)"
POSITIONS = ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
             "at::native::index_copy_kernel_impl<at::native::OpaqueType<8> >(...)>")
SCATTER_H = ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
             "at::native::index_copy_kernel_impl<at::native::OpaqueType<2> >(...)>")
COPY = "Memcpy DtoD (Device -> Device)"

SM90A_CALL = [  # the sorted-h handover: gate|up stage, then down stage (moe_route.SortedGroupedLauncher)
    (WHERE, 2.0), (SORT, 9.0), (COUNTS, 1.5), (SCAN, 2.5), (GATHER, 6.0), (COPY, 1.0),
    ("mg_moe_sm90a_f16_u4_t128x128x64_s4", 300.0),
    (WHERE, 2.0), (SEGMENTS, 1.0), (ONESWEEP, 8.0), (COUNTS, 1.5), (SCAN, 2.5),
    ("mg_moe_sm90a_f16_u4_t128x128x64_s4", 150.0), (POSITIONS, 1.0), ("mg_combine_k", 12.0),
]
GEMV_CALL = [("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda...>", 1.0),
             ("mg_moe_f16_u4_w13_s1_w4x2_u8", 13.0), ("mg_moe_f16_u4_w13_s1_w4x2_u8", 1.0),
             ("mg_moe_f16_u4_w2_s1_w4x2_u8", 9.0)]


def test_stages_of_a_tile_family_call():
    got = bd.classify(SM90A_CALL)
    assert got["sort"] == (18.0, 3)
    assert got["gathers"] == (6.0, 1)
    assert got["gate|up GEMM"] == (300.0, 1) and got["down GEMM"] == (150.0, 1)  # same kernel name: by order
    assert got["top-k combine"] == (12.0, 1) and got["SiLU·mul"] == (0.0, 0)
    assert got["routing"] == (pytest.approx(14.0), 8)
    assert sum(n for _, n in got.values()) == len(SM90A_CALL)


def test_stages_of_moe_gemv_and_moe_sm80():
    got = bd.classify(GEMV_CALL)
    assert got["gate|up GEMM"] == (14.0, 2) and got["down GEMM"] == (9.0, 1) and got["routing"] == (1.0, 1)
    assert bd.stage_of("mg_moe_sm80_f16_u4_t64x128x64_w2x2x1_s3", gate_up_seen=True) == "down GEMM"
    assert bd.stage_of("mg_moe_sm80_f16_u4_t64x128x64_w2x2x1_s3_gate_up", gate_up_seen=False) == "gate|up GEMM"
    assert bd.stage_of(SCATTER_H, gate_up_seen=True) == "gathers"
    assert bd.stage_of(POSITIONS, gate_up_seen=True) == "routing"


def test_stages_of_the_counting_sort_and_the_fused_kernels():
    """The tile families' own routing kernels: the counting sort's two launches are the sort, the
    row gather the gathers, mg_pointers bookkeeping; a fused moe_sm80 down GEMM leaves the combine
    fused."""
    name = "mg_moe_sm80_f16_u4_t128x128x64_w2x2x1_s4_f"
    call = [(name + "_route_count", 2.0), (name + "_route_scatter", 3.0), (name + "_gate_up", 300.0),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >", 4.0),
            (name, 150.0), ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", 5.0)]
    got = bd.classify(call)
    assert got["sort"] == (5.0, 2) and got["gathers"] == (0.0, 0)
    assert got["gate|up GEMM"] == (300.0, 1) and got["down GEMM"] == (150.0, 1)
    assert got["routing"] == (9.0, 2) and got["top-k combine"] == (0.0, 0)
    for lib in ("mg_route_count", "mg_route_scatter"):
        assert bd.stage_of(lib, gate_up_seen=False) == "sort"
    for lib in ("mg_gather", "mg_gather_k"):  # mg_gather_k: the grouped libraries' (common/moe_route_lib.j2)
        assert bd.stage_of(lib, gate_up_seen=True) == "gathers"
    assert bd.stage_of("mg_combine_k", gate_up_seen=True) == "top-k combine"
    assert bd.stage_of("mg_moe_sm80_f16_u4_t64x128x64_w2x2x1_s4_gather", gate_up_seen=False) == "gathers"
    assert bd.stage_of("mg_pointers", gate_up_seen=True) == "routing"


def _events(replays, corr=True):
    events, t = [], 0.0
    for r in range(replays):
        for name, us in [("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >", 40.0)] + GEMV_CALL:
            events.append((name, t, t + us, 100 + r if corr else 0))
            t += us + 0.5
    events.append(("void at::native::stray", t, t + 1.0, 7))  # a launch outside the replays
    return events


@pytest.mark.parametrize("corr", [True, False])
def test_replays_split_from_the_profiler_events(corr):
    events = _events(3, corr)
    if not corr:
        events = events[:-1]  # no ids: only the replays' kernels, split into equal runs
    runs = bd.split_replays(events[::-1], 3)  # any order in
    assert len(runs) == 3 and all([n for n, _, _ in r] == [n for n, _ in GEMV_CALL] for r in runs)
    assert runs[0][0][1] < runs[1][0][1] < runs[2][0][1]
    summary = bd.summarize(runs)
    assert summary["kernels"] == 4 and summary["sum_us"] == pytest.approx(24.0)
    assert summary["span_us"] == pytest.approx(24.0 + 3 * 0.5)
    with pytest.raises(ValueError, match="cannot split"):
        bd.split_replays([(n, s, e, 0) for n, s, e, _ in events[:5]], 3)


def test_a_dependent_launch_counts_from_the_end_of_the_kernel_it_waits_on():
    """PDL: the down kernel starts 3 µs before gate|up ends; the overlap is gate|up's, so the
    stages add up to the span."""
    gate_up, down = GEMV_CALL[0][0], GEMV_CALL[-1][0]
    replay = [(gate_up, 0.0, 10.0), (down, 7.0, 15.0)]
    assert bd.exclusive(replay) == [(gate_up, 10.0), (down, 5.0)]
    summary = bd.summarize([replay])
    assert summary["sum_us"] == pytest.approx(15.0) == pytest.approx(summary["span_us"])
    assert summary["replay_sum_us"] == [pytest.approx(15.0)]
    assert bd.exclusive([(gate_up, 0.0, 10.0), (down, 2.0, 8.0)])[1] == (down, 0.0)  # wholly inside


def _serial(call, gap=0.5):
    """One replay of ``call``'s ``(name, µs)`` kernels one after another, ``gap`` µs apart."""
    out, t = [], 0.0
    for name, us in call:
        out.append((name, t, t + us))
        t += us + gap
    return out


def test_one_table_per_model_with_fused_stages_and_errors():
    runs = [_serial(SM90A_CALL)]
    tile = dict(model="mixtral-8x7b", tokens=4096, kernels_run="moe_sm90a:w13_t128x128x64_s4 + moe_sm90a:w2_t128x128x64_s4",
                **bd.summarize(runs))
    gemv = dict(model="mixtral-8x7b", tokens=1, kernels_run="moe_gemv:w13 + moe_gemv:w2",
                **bd.summarize([_serial(GEMV_CALL)]))
    failed = dict(model="qwen3-30b-a3b", tokens=1, kernels_run="-", error="RuntimeError: not capturable")
    lines = bd.table([tile, gemv, failed])
    titles = [line for line in lines if line.startswith("### ")]
    assert [t.split(":")[0] for t in titles] == ["### mixtral-8x7b", "### qwen3-30b-a3b"]
    rows = [line for line in lines if line.startswith("|")]
    assert len({line.replace("\\|", "").count("|") for line in rows}) == 1  # gate\|up: an escaped pipe
    gemv_line = next(line for line in rows if line.startswith("| 1 |") and "moe_gemv" in line)
    assert "| fused |" in gemv_line and gemv_line.count("fused") == 2  # SiLU·mul and the top-k combine
    tile_line = next(line for line in rows if line.startswith("| 4096 |"))
    assert "| 300.0 (60%) |" in tile_line and "| 12.0 (2%) |" in tile_line and tile_line.count("fused") == 1
    assert any("RuntimeError: not capturable" in line for line in rows)
