"""The sweep's plan without a GPU: ``--against-profile`` adds each (shape, M)'s existing winner."""
from mixed_gemm.profiler.sweep import SweepSpec, _current_schedules, _with_current
from mixed_gemm.select.profiles import Profile


def _entry(n, m, schedule):
    return dict(dtype="f16", bits=4, zero_mode="int", group_size=128, n=n, k=4096, m=m, schedule=schedule, us=9.0)


def test_against_profile_adds_the_current_winner_once():
    current = Profile({"name": "x"}, {}, [_entry(4096, 16, "sm80:t16x64x128_w1x1x4_s6_sm90a"),
                                          _entry(4096, 64, "sm90s:t128x64x128_c1x1_o1_s0_auto"),
                                          _entry(6144, 16, "gemv:m16_s1_w1x8_u16_xs")])
    spec = SweepSpec(problems=[("o", 4096, 4096)], ms=[16, 64, 128])
    mine = ["sm90s:t128x16x128_c1x1_o2_s0_auto", "sm90s:t128x64x128_c1x1_o1_s0_auto"]
    plan = [("o", 4096, 4096, m, list(mine)) for m in (16, 64, 128)]
    got = {m: s for _, _, _, m, s in _with_current(plan, current, spec)}
    assert got[16] == mine + ["sm80:t16x64x128_w1x1x4_s6_sm90a"]
    assert got[64] == mine  # already a candidate: timed once
    assert got[128] == mine  # no entry at this bucket
    other = SweepSpec(problems=[("o", 4096, 4096)], ms=[16], dtype="bf16")
    assert {m: s for _, _, _, m, s in _with_current(plan[:1], current, other)}[16] == mine  # another key


def test_current_schedules_of_the_swept_shapes_and_buckets():
    current = Profile({"name": "x"}, {}, [_entry(4096, 16, "sm80:t16x64x128_w1x1x4_s6"),
                                          _entry(4096, 64, "sm90s:t128x64x128_c1x1_o1_s0_auto"),
                                          _entry(6144, 16, "gemv:m16_s1_w1x8_u16_xs")])
    spec = SweepSpec(problems=[("o", 4096, 4096)], ms=[16, 32])
    assert _current_schedules(current, spec) == ["sm80:t16x64x128_w1x1x4_s6"]


def test_layer_pairs_winners_first_then_heuristics_then_the_top_three_crossed():
    from mixed_gemm.profiler.moe_sweep import LAYER_TOP, layer_pairs

    assert LAYER_TOP == 3
    times = {"w13": {"a:1": 3.0, "a:2": 1.0, "b:1": 2.0, "c:1": 4.0},
             "w2": {"a:9": 5.0, "a:8": 4.0, "b:7": 6.0, "c:7": 7.0}}
    pairs = layer_pairs(times, {"w13": "c:1", "w2": "c:7"})
    assert pairs[0] == ("a:2", "a:8") and pairs[1] == ("c:1", "c:7")
    top = [("a:2", "b:1", "a:1"), ("a:8", "a:9", "b:7")]
    assert set(pairs[2:]) == {(a, b) for a in top[0] for b in top[1]} - {("a:2", "a:8")}
    assert len(pairs) == 2 + 9 - 1  # the fourth of a stage enters only as the heuristics' pair
    assert layer_pairs(times, {"w13": None, "w2": "a:9"})[1] == ("a:2", "a:9")  # no heuristic pair: skipped
    cross = {"w13": {"a:1": 1.0, "b:1": 2.0}, "w2": {"b:2": 1.0, "a:2": 2.0}}
    assert layer_pairs(cross, {})[0] == ("a:1", "b:2")  # a profile's pair may mix families
