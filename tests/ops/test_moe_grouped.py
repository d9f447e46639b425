"""The grouped plan's forced schedules (``$MIXED_GEMM_MOE_SCHEDULE``, ``forced_schedules``): what a
plan runs and reports, the cache they go through, and the reasons an override cannot run (CPU: the
plan asked for device 0 of an H100)."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import base
from mixed_gemm.kernels.moe_gemv import FAMILY, MoeGemvConfig
from mixed_gemm.ops import moe_grouped
from mixed_gemm.ops.moe_grouped import SCHEDULE_ENV, GroupedPlan, clear_plans, forced_schedules, grouped_plan

H, INTER, TOP_K = 128, 64, 2
PE13, PE2 = "moe_gemv:w13_s1_w4x2_u8_m8_pe_split2", "moe_gemv:w2_s1_w4x2_u8_m16_pe"
XE13, XE2 = "moe_gemv:w13_s1_w4x2_u8_m16_xe", "moe_gemv:w2_s1_w4x2_u8_kloop"


def _experts(n, k, *, layout="sm90a", e=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (e, n, k), generator=gen, dtype=torch.uint8)
    s = torch.rand(e, n, k // 32, generator=gen) * 0.01 + 0.001
    z = torch.randint(0, 16, (e, n, k // 32), generator=gen).float()
    return mg.prepack_experts(q, s, z, bits=4, group_size=32, layout=layout)


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    monkeypatch.setattr(moe_grouped, "GROUPED", {})
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)
    return _experts(2 * INTER, H), _experts(H, INTER, seed=1)


def _schedules(plan):
    return [f"{f.name}:{c.schedule}" for f, c in zip(plan.families, plan.configs)]


def test_environment_forces_every_plan_read_when_a_plan_is_made(h100, monkeypatch):
    w13, w2 = h100
    x = torch.zeros(3, H, dtype=torch.float16)
    plain = grouped_plan(x, w13, w2, TOP_K)
    assert isinstance(plain, GroupedPlan) and plain.source == "heuristic"
    monkeypatch.setenv(SCHEDULE_ENV, f"{PE13}, {PE2}")
    assert grouped_plan(x, w13, w2, TOP_K) is plain  # cached: the variable is not read on the hot path
    clear_plans()
    plan = grouped_plan(x, w13, w2, TOP_K)
    assert _schedules(plan) == [PE13, PE2] and plan.source == "override" and plan.family is FAMILY
    assert plan.configs[0] == MoeGemvConfig.from_schedule(PE13.split(":")[1], zero_mode=w13.zero_mode)
    assert "source='override'" in repr(plan)
    assert plan.pays(4096, TOP_K, 16) and not plain.pays(4096, TOP_K, 16)  # forced: the grouped path at any T
    assert grouped_plan(torch.zeros(300, H, dtype=torch.float16), w13, w2, TOP_K).configs == plan.configs
    # The configs argument still wins (tests, sweeps).
    forced = (MoeGemvConfig(stage="w13"), MoeGemvConfig(stage="w2"))
    assert grouped_plan(x, w13, w2, TOP_K, forced).source == "configs argument"


def test_forced_schedules_nest_ahead_of_the_environment_and_forget_plans(h100, monkeypatch):
    w13, w2 = h100
    x = torch.zeros(16, H, dtype=torch.float16)
    monkeypatch.setenv(SCHEDULE_ENV, f"{XE13},{XE2}")
    assert _schedules(grouped_plan(x, w13, w2, TOP_K)) == [XE13, XE2]
    with forced_schedules(PE13, PE2):
        assert _schedules(grouped_plan(x, w13, w2, TOP_K)) == [PE13, PE2]
        with forced_schedules(XE13, PE2):
            assert _schedules(grouped_plan(x, w13, w2, TOP_K)) == [XE13, PE2]
        assert _schedules(grouped_plan(x, w13, w2, TOP_K)) == [PE13, PE2]
    assert _schedules(grouped_plan(x, w13, w2, TOP_K)) == [XE13, XE2]
    monkeypatch.delenv(SCHEDULE_ENV)
    with forced_schedules(PE13, PE2):
        pass
    assert grouped_plan(x, w13, w2, TOP_K).source == "heuristic"  # forgotten on exit
    with pytest.raises(RuntimeError, match="boom"), forced_schedules(PE13, PE2):
        raise RuntimeError("boom")
    assert grouped_plan(x, w13, w2, TOP_K).source == "heuristic"


@pytest.mark.parametrize("text, message", [
    (PE13, r"MIXED_GEMM_MOE_SCHEDULE: expected 'family:gate\|up schedule,family:down schedule'"),
    (f"{PE2},{PE13}", r"moe_gemv cannot run the w13 projection here: .* is the w2 kernel"),
    (f"gemv:m8_s2_w4x2_u8,{PE2}", r"'gemv:m8_s2_w4x2_u8' is a gemv schedule, not one of a grouped family \(moe_"),
    (f"nope:w13,{PE2}", r"MIXED_GEMM_MOE_SCHEDULE: 'nope:w13': family: 'nope' is not one of"),
    (f"moe_gemv:w13_bogus,{PE2}", r"MIXED_GEMM_MOE_SCHEDULE: 'moe_gemv:w13_bogus': schedule: 'w13_bogus' is not"),
])
def test_an_override_that_cannot_run_raises_naming_why(h100, monkeypatch, text, message):
    w13, w2 = h100
    monkeypatch.setenv(SCHEDULE_ENV, text)
    with pytest.raises(ValueError, match=message):
        grouped_plan(torch.zeros(3, H, dtype=torch.float16), w13, w2, TOP_K)


def test_an_override_names_its_source_and_the_layout_rule(h100, monkeypatch):
    with forced_schedules(PE13, PE2), pytest.raises(ValueError, match=r"^forced_schedules=.*reads the 'sm90a'"):
        grouped_plan(torch.zeros(3, H, dtype=torch.float16), _experts(2 * INTER, H, layout="sm80"),
                     _experts(H, INTER, layout="sm80"), TOP_K)
    monkeypatch.setattr(base, "compute_capability", lambda i: (7, 5))
    with forced_schedules(PE13, PE2), pytest.raises(ValueError, match=r"cannot run the w13 projection here: .*7\.5"):
        grouped_plan(torch.zeros(3, H, dtype=torch.float16), *h100, TOP_K)


class _Recorder:
    """A grouped launcher stand-in: records each call's ``pdl`` and ``pdl_prefetch`` (None: not passed)."""

    def __init__(self, calls, name, pdl_capable=None, pdl_default=None):
        self.calls, self.name = calls, name
        if pdl_capable is not None:
            self.pdl_capable = pdl_capable
        if pdl_default is not None:
            self.pdl_default = pdl_default

    def __call__(self, x, w, ids, weights, out, tokens, top_k, stream, **kw):
        self.calls.append((self.name, kw.get("pdl"), kw.get("pdl_prefetch")))


@pytest.fixture
def pdl_env(monkeypatch):
    """``$MIXED_GEMM_MOE_PDL`` unset and read afresh (it is read once per process)."""
    monkeypatch.delenv(moe_grouped.PDL_ENV, raising=False)
    monkeypatch.setattr(moe_grouped, "current_stream", lambda dev: 0)
    moe_grouped._pdl_env.cache_clear()
    yield monkeypatch
    moe_grouped._pdl_env.cache_clear()


def _run(w13, w2, capable=True, default=None):
    calls = []
    launchers = (_Recorder(calls, "gate_up", False), _Recorder(calls, "down", capable, default))
    x = torch.randn(2, H, generator=torch.Generator().manual_seed(5)).half()
    ids, weights = torch.zeros(2, TOP_K, dtype=torch.int64), torch.ones(2, TOP_K)
    moe_grouped.run_grouped(launchers, x, w13, w2, weights, ids)
    return calls


PLAIN, PDL, PDL_PREFETCH = ("down", None, None), ("down", True, None), ("down", True, True)
GATE_UP = ("gate_up", None, None)  # never: gate|up does not wait for the kernel before it


def test_pdl_follows_the_launcher_by_default_and_off_turns_it_off(h100, pdl_env):
    """Unset (``auto``): the launchers whose ``pdl_default`` says so (moe_gemv's pair-mode downs),
    without the L2 prefetch. ``off``: none. The variable is read once."""
    w13, w2 = h100
    assert moe_grouped.pdl_mode() == "auto" and not moe_grouped.pdl_enabled()
    assert _run(w13, w2, default=True) == [GATE_UP, PDL]
    pdl_env.setenv(moe_grouped.PDL_ENV, "off")
    assert _run(w13, w2, default=True) == [GATE_UP, PDL]  # read once: not on the hot path
    moe_grouped._pdl_env.cache_clear()
    assert _run(w13, w2, default=True) == [GATE_UP, PLAIN]
    pdl_env.setenv(moe_grouped.PDL_ENV, "auto")
    moe_grouped._pdl_env.cache_clear()
    assert _run(w13, w2, default=False) == [GATE_UP, PLAIN]
    assert _run(w13, w2) == [GATE_UP, PLAIN]  # no pdl_default attribute: not in auto mode


@pytest.mark.parametrize("text, mode", [("", "auto"), ("auto", "auto"), ("0", "off"), ("off", "off"),
                                        ("false", "off"), ("no", "off"), ("1", "on"), ("on", "on"),
                                        ("prefetch", "prefetch")])
def test_the_environment_names_a_mode(h100, pdl_env, text, mode):
    w13, w2 = h100
    pdl_env.setenv(moe_grouped.PDL_ENV, text)
    assert moe_grouped.pdl_mode() == mode
    expected = {"auto": PLAIN, "off": PLAIN, "on": PDL, "prefetch": PDL_PREFETCH}[mode]
    assert _run(w13, w2, default=False) == [GATE_UP, expected]


def test_pdl_launches_nests_ahead_of_the_environment(h100, pdl_env):
    w13, w2 = h100
    pdl_env.setenv(moe_grouped.PDL_ENV, "1")
    with moe_grouped.pdl_launches(False):
        assert _run(w13, w2, default=True) == [GATE_UP, PLAIN]
        with moe_grouped.pdl_launches():
            assert _run(w13, w2) == [GATE_UP, PDL]
            with moe_grouped.pdl_launches(prefetch=True):
                assert _run(w13, w2) == [GATE_UP, PDL_PREFETCH]
        assert not moe_grouped.pdl_enabled()
    assert moe_grouped.pdl_enabled()
    with pytest.raises(RuntimeError, match="boom"), moe_grouped.pdl_launches(False):
        raise RuntimeError("boom")
    assert moe_grouped.pdl_enabled() and moe_grouped._PDL == []


def test_pdl_goes_only_to_down_launchers_that_can_wait(h100, pdl_env):
    """Another family's launcher (no ``pdl_capable``), or moe_gemv's on an sm_80 device, launches as before."""
    w13, w2 = h100
    with moe_grouped.pdl_launches(prefetch=True):
        assert _run(w13, w2, capable=None) == [GATE_UP, PLAIN]
        assert _run(w13, w2, capable=False, default=False) == [GATE_UP, PLAIN]
