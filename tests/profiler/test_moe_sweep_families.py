"""profile-moe --families F --against-profile (moe_sweep.stage_schedules, CPU): a family in F offers
every candidate; a family outside F offers only the schedule the swept-against profile runs now for
the problem, and only when that schedule is its own; a family in F offers that schedule too when it
is no longer among its candidates (the layer check records the incumbent's own stage times)."""
from mixed_gemm.kernels import MoeProblem
from mixed_gemm.kernels.moe_gemv import FAMILY as GEMV
from mixed_gemm.kernels.moe_sm90s import FAMILY as SM90S
from mixed_gemm.profiler.moe_sweep import stage_schedules
from mixed_gemm.select import Profile

PROBLEM = MoeProblem(tokens=16, top_k=8, experts=128, n=4096, k=2048, dtype="f16", bits=4, zero_mode="int",
                     group_size=128, layout="sm90a", stage="w2", gate_up=False)


def _profile(schedule: str) -> Profile:
    profile = Profile()
    profile.add_grouped(dict(dtype="f16", bits=4, zero_mode="int", group_size=128, experts=128, top_k=8, n=4096,
                             k=2048, stage="w2", tokens=16, schedule=schedule, us=10.0))
    return profile


def test_family_in_the_filter_offers_every_candidate():
    assert stage_schedules(SM90S, PROBLEM, 132, ["moe_sm90s"]) == list(SM90S.candidates(PROBLEM, 132))
    assert stage_schedules(GEMV, PROBLEM, 132) == list(GEMV.candidates(PROBLEM, 132))


def test_family_outside_the_filter_offers_only_the_current_entry():
    current_gemv = GEMV.candidates(PROBLEM, 132)[0]
    profile = _profile(f"moe_gemv:{current_gemv}")
    assert stage_schedules(GEMV, PROBLEM, 132, ["moe_sm90s"], profile) == [current_gemv]
    assert stage_schedules(GEMV, PROBLEM, 132, ["moe_sm90s"], None) == []  # no --against-profile
    other = _profile(f"moe_sm90s:{SM90S.candidates(PROBLEM, 132)[0]}")
    assert stage_schedules(GEMV, PROBLEM, 132, ["moe_sm80"], other) == []  # the entry is another family's


def test_family_in_the_filter_adds_a_current_entry_outside_its_candidates():
    cands = list(GEMV.candidates(PROBLEM, 132))
    retired = "w2_s2_w4x2_u8_ds_split7"  # a schedule the candidates do not offer at this problem
    assert retired not in cands
    assert stage_schedules(GEMV, PROBLEM, 132, ["moe_gemv"], _profile(f"moe_gemv:{retired}")) == cands + [retired]
    assert stage_schedules(GEMV, PROBLEM, 132, ["moe_gemv"], _profile(f"moe_gemv:{cands[0]}")) == cands
    assert stage_schedules(GEMV, PROBLEM, 132, None, _profile(f"moe_gemv:{retired}")) == cands + [retired]
