"""Confirming a sweep (mixed_gemm/profiler/confirm.py): which entries changed, and a copy of the
shipped profile that takes only the changes an A/B confirmed by more than the margin."""
from mixed_gemm.profiler.confirm import Change, changes, confirmed
from mixed_gemm.select.profiles import Profile

GPU = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sms": 132}


def entry(n, m, schedule, us, dtype="f16"):
    return dict(dtype=dtype, bits=4, zero_mode="int", group_size=128, n=n, k=4096, m=m, schedule=schedule, us=us)


def profiles():
    shipped = Profile(GPU, {}, [entry(4096, 16, "sm90s:t128x16x128_c1x1_o1_s0_auto", 9.2),
                                entry(4096, 64, "sm90s:t128x32x128_c1x1_o2_s0_auto", 12.2),
                                entry(6144, 16, "sm90s:t128x16x128_c1x1_o2_s0_auto", 11.3, "bf16")])
    shipped.add_grouped(dict(dtype="f16", bits=4, zero_mode="int", group_size=128, experts=8, top_k=2, n=28672,
                             k=4096, stage="w13", tokens=1, schedule="moe_gemv:w13_s1_w4x2_u8_ds", us=49.0))
    swept = Profile(GPU, {}, [entry(4096, 16, "sm90s:t128x16x128_c1x1_o1_s0_auto", 9.0),    # same schedule
                              entry(4096, 64, "sm90s:t128x32x128_c1x2_o1_s0_auto", 11.9),   # changed
                              entry(6144, 16, "sm90s:t128x16x128_c1x4_o2_s0_auto", 10.4, "bf16"),  # changed
                              entry(8192, 16, "sm90s:t128x16x128_c1x1_o2_s0_auto", 18.0)])  # new key
    return shipped, swept


def test_changes_are_the_entries_whose_schedule_moved_and_new_keys_are_listed():
    shipped, swept = profiles()
    found, added = changes(shipped, swept)
    assert [(c.key[0], c.key[4], c.m, c.new.split(":")[1]) for c in found] == [
        ("bf16", 6144, 16, "t128x16x128_c1x4_o2_s0_auto"), ("f16", 4096, 64, "t128x32x128_c1x2_o1_s0_auto")]
    assert added == ["f16 u4 int g128 8192x4096 M=16"]


def test_confirmed_takes_only_changes_that_won_by_the_margin():
    shipped, swept = profiles()
    found, _ = changes(shipped, swept)
    bf16, f16 = found
    timed = {f16: (12.2e-6, 12.0e-6), bf16: (11.4e-6, 11.35e-6)}  # f16 wins by 1.6%, bf16 by 0.4%
    out, lines = confirmed(shipped, timed)
    assert out.entry(f16.key, 64)["schedule"] == f16.new and out.entry(f16.key, 64)["us"] == 12.0
    assert out.entry(bf16.key, 16)["schedule"] == bf16.old
    assert out.entry(f16.key, 16)["schedule"] == "sm90s:t128x16x128_c1x1_o1_s0_auto"  # unchanged entry
    assert len(out.entries) == len(shipped.entries) and out.grouped == shipped.grouped and out.gpu == GPU
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["taken", "kept"]
    # the shipped profile itself is untouched
    assert shipped.entry(f16.key, 64)["schedule"] == f16.old
    # a larger margin keeps the f16 change out too
    out, _ = confirmed(shipped, timed, margin=0.05)
    assert out.entry(f16.key, 64)["schedule"] == f16.old


def test_change_label_names_kind_shape_and_bucket():
    c = Change(("f16", 4, "int", 128, 4096, 4096), 64, "sm90s:a", "sm90s:b")
    assert c.label == "f16 u4 int g128 4096x4096 M=64"
