"""The sweeps compile their candidates before timing them (profiler/prebuild.py), without a GPU:
which specs each sweep hands over, and what the step does with JIT off or a failed build."""
from types import SimpleNamespace

import pytest

from mixed_gemm.compile import BuildError
from mixed_gemm.kernels.moe_gemv import FAMILY as MOE_GEMV
from mixed_gemm.profiler import moe_sweep, prebuild
from mixed_gemm.profiler.sweep import SweepSpec, _key, _row_id, shape_specs


def _spec(name):
    return SimpleNamespace(name=name)


def test_build_candidates_builds_each_kernel_once(monkeypatch):
    seen = {}

    def build_specs(specs, jobs=None, progress=False):
        seen["names"], seen["jobs"] = [s.name for s in specs], jobs
        return {s.name: None for s in specs}

    monkeypatch.setattr(prebuild, "build_specs", build_specs)
    monkeypatch.setattr(prebuild, "jit_mode", lambda: "block")
    logs = []
    assert prebuild.build_candidates([_spec("a"), _spec("b"), _spec("a")], 6, logs.append) == 2
    assert seen == {"names": ["a", "b", "a"], "jobs": 6} and "2 candidate kernels ready" in logs[-1]
    assert prebuild.build_candidates([], 6, logs.append) == 0


def test_build_candidates_with_jit_off_or_a_failure(monkeypatch):
    def failing(specs, jobs=None, progress=False):
        raise BuildError("nvcc failed on mg_x\nmore")

    monkeypatch.setattr(prebuild, "build_specs", failing)
    logs = []
    monkeypatch.setattr(prebuild, "jit_mode", lambda: "off")
    assert prebuild.build_candidates([_spec("a")], None, logs.append) == 0 and not logs  # never asked to build
    monkeypatch.setattr(prebuild, "jit_mode", lambda: "block")
    assert prebuild.build_candidates([_spec("a")], None, logs.append) == 0
    assert "nvcc failed on mg_x" in logs[-1] and "compile as they are timed" in logs[-1] and "more" not in logs[-1]


class _OnAnyGpu:
    """moe_gemv as the sweep sees it on a GPU that runs it."""
    name = MOE_GEMV.name

    def supports(self, dev):
        return True, ""

    def __getattr__(self, attr):
        return getattr(MOE_GEMV, attr)


@pytest.mark.parametrize("tokens", [[1], [1, 16]])
def test_moe_candidate_specs_cover_what_the_sweep_times(monkeypatch, tokens):
    monkeypatch.setattr(moe_sweep, "GROUPED_FAMILIES", (_OnAnyGpu(),))
    shape = moe_sweep.MOE_MODELS["qwen3-30b-a3b"]
    w13 = SimpleNamespace(n=2 * shape.inter, k=shape.hidden, zero_mode="int", gate_up=True)
    w2 = SimpleNamespace(n=shape.hidden, k=shape.inter, zero_mode="int", gate_up=False)
    import torch

    names = {s.name for s in moe_sweep.candidate_specs(shape, tokens, w13, w2, torch.float16, 4, 0, 132)}
    want = set()
    for t in tokens:
        problems = [moe_sweep.stage_problem(shape, t, w, st, torch.float16, 4) for st, w in (("w13", w13), ("w2", w2))]
        for p in problems:
            own, cands = moe_sweep.stage_configs(MOE_GEMV, p, 132)
            assert cands
            want |= {MOE_GEMV.build_spec(c).name for c in cands + ([own] if own else [])}
        for pair in MOE_GEMV.layer_candidates(problems, 132):
            want |= {MOE_GEMV.build_spec(MOE_GEMV.from_schedule(sc, **p.kind)).name for sc, p in zip(pair, problems)}
    assert names == want and any(n.endswith("_pe1") for n in names)  # the one-launch kernels too


def test_dense_shape_specs_skip_timed_and_unparsable_schedules():
    spec = SweepSpec(problems=[("o", 4096, 4096), ("qkv", 6144, 4096)], ms=[1, 16])
    gemv, sm90s = "gemv:m8_s1_w1x8_u16_ds", "sm90s:t128x16x128_c1x1_o2_s0_auto"
    plan = [("o", 4096, 4096, 1, [gemv, "gemv:not_a_schedule"]), ("o", 4096, 4096, 16, [sm90s]),
            ("qkv", 6144, 4096, 1, ["gemv:m8_s2_w8x1_u8_ds"])]
    key = _key(spec, 4096, 4096)
    done = {_row_id(dict(key, m=16, schedule=sm90s)): {}}  # already timed (a resumed sweep)
    names = [s.name for s in shape_specs(plan, 4096, 4096, key, done, spec, "int")]
    assert len(names) == 1 and names[0].startswith("mg_gemv_f16_u4")
