"""The moe_gemv (grouped MoE decode) family's config, rendering, argument mirror, launch geometry,
heuristics, candidates, can_implement reasons, and how ``moe`` picks it (CPU)."""
import re
from pathlib import Path

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import GROUPED_FAMILIES, MoeProblem, Problem, family, parse_schedule, qualified
from mixed_gemm.kernels.moe_gemv import FAMILY, MoeGemvConfig
from mixed_gemm.kernels.moe_gemv.abi import MOE_GEMV_ARGS_BYTES, MoeGemvArgs
from mixed_gemm.kernels.moe_gemv.candidates import candidate_schedules
from mixed_gemm.kernels.moe_gemv.config import MAX_STATIC_SMEM
from mixed_gemm.kernels.moe_gemv.heuristics import PAIR_REREAD, WORKSPACE_FLOATS, heuristic_config, pays

IDENTITIES = {c.kernel_name for c in FAMILY.catalog()}
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
# (E, top_k, H, I) of the presets in mixed_gemm/benchmark/moe.py: Qwen3-30B-A3B, Mixtral, DeepSeek-V2-Lite
PRESETS = ((128, 8, 2048, 768), (8, 2, 4096, 14336), (64, 6, 2048, 1408))


def _problem(stage="w13", tokens=1, top_k=2, experts=8, h=4096, inter=1024, **kw):
    n, k = (2 * inter, h) if stage == "w13" else (h, inter)
    base = dict(tokens=tokens, top_k=top_k, experts=experts, n=n, k=k, dtype="f16", bits=4, zero_mode="int",
                group_size=128, layout="sm90a", stage=stage)
    return MoeProblem(**dict(base, **kw))


@pytest.mark.parametrize("schedule", ["w13_s2_w4x1_u8", "w13_s1_w4x2_u8_split6", "w2_s2_w4x2_u8_split3_kloop",
                                      "w2_s1_w4x2_u4_kloop", "w2_s4_w2x2_u2"])
def test_schedule_round_trip_and_names(schedule):
    c = MoeGemvConfig.from_schedule(schedule, dtype="bf16", bits=8, zero_mode="float")
    assert c.schedule == schedule and qualified(c) == f"moe_gemv:{schedule}"
    assert parse_schedule(qualified(c), dtype="bf16", bits=8, zero_mode="float") == c
    k = c.kernel
    assert (k.splits, k.slot_loop, k.zero_mode) == (1, False, "int") and k.kernel == k  # launch fields, folded zeros
    assert c.kernel_name == k.kernel_name == f"mg_moe_bf16_u8_{k.schedule}"
    assert c.name == f"mg_moe_bf16_u8_zfloat_{schedule}"
    assert family("moe_gemv") is FAMILY and FAMILY in GROUPED_FAMILIES
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("m1_s2_w4x2_u8")
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s2_w4x1_u8_kloop_split2")  # _kloop comes last


@pytest.mark.parametrize("kw, rule", [
    (dict(stage="w3"), r"stage must be one of \('w13', 'w2'\)"),
    (dict(strips=9), r"strips must be in \[1, 8\]"),
    (dict(warps=(8, 4)), "warps: at most 512 threads"),
    (dict(warps=(0, 1)), "warps: at most 512 threads"),
    (dict(unroll=3), "unroll must be a power of two <= 32"),
    (dict(splits=0), r"splits must be in \[1, 32\]"),
    (dict(splits=33), r"splits must be in \[1, 32\]"),
    (dict(slot_loop=True), r"slot_loop \(_kloop\) is the down projection's"),
    (dict(bits=3), r"bits must be one of \(4, 8\)"),
    (dict(dtype="f32"), "dtype must be one of"),
    (dict(zero_mode="nf4"), "zero_mode must be one of"),
    (dict(strips=8, warps=(1, 16)), "shared memory 61440 B above the static 49152 B"),
])
def test_rules_name_themselves(kw, rule):
    with pytest.raises(ValueError, match=r"^MoeGemvConfig: " + rule):
        MoeGemvConfig(**kw)


def test_derived_sizes():
    c = MoeGemvConfig(stage="w13", strips=2, warps=(4, 2), unroll=8)
    assert (c.threads, c.rows, c.accumulators, c.step) == (256, 128, 8, 16)  # gate and up strips per lane
    assert c.smem_bytes == 1 * 4 * 8 * 32 * 4
    d = c.replace(stage="w2")
    assert (d.rows, d.accumulators, d.smem_bytes) == (128, 4, 1 * 4 * 4 * 32 * 4)
    assert MoeGemvConfig(warps=(4, 1)).smem_bytes == 0


def test_catalog_is_small_and_covers_every_kind_and_stage():
    cat = FAMILY.catalog()
    assert 0 < len(cat) <= 24 and len(IDENTITIES) == len(cat)
    assert cat[0].stage == "w13"  # tests/kernels/test_families.py builds its problem from the first config
    for dtype in ("f16", "bf16"):
        for bits in (4, 8):
            stages = {c.stage for c in cat if (c.dtype, c.bits) == (dtype, bits)}
            assert stages == {"w13", "w2"}
    assert all(c.kernel == c and c.smem_bytes <= MAX_STATIC_SMEM for c in cat)


def _struct_fields(text: str, name: str):
    body = re.search(r"struct %s \{(.*?)\n\};" % name, text, re.S).group(1)
    fields = []
    for line in body.splitlines():
        decl = line.split("//")[0].strip()
        if decl:
            m = re.fullmatch(r"(?:[\w:]+\s*)+?(?:const\s*)?\**\s*((?:\w+\s*,\s*)*\w+);", decl)
            assert m, decl
            fields += [f.strip() for f in m.group(1).split(",")]
    return fields


def test_argument_block_mirrors_the_cxx_struct():
    text = (TEMPLATES / "moe_gemv" / "moe_gemv.cuh").read_text()
    assert _struct_fields(text, "MoeGemvArgs") == [f for f, _ in MoeGemvArgs._fields_]
    assert MOE_GEMV_ARGS_BYTES == 9 * 8 + 2 * 8 + 14 * 4


@pytest.mark.parametrize("config", FAMILY.catalog(), ids=lambda c: c.kernel_name)
def test_every_catalog_config_renders_its_numbers(config):
    src = FAMILY.render(config)
    assert src.startswith("// Generated by mixed_gemm from templates/moe_gemv/kernel.cu.j2; do not edit.\n")
    assert f"// Kernel: {config.kernel_name}\n// Config: {config.kernel!r}\n" in src
    assert '#include "moe_gemv/moe_gemv.cuh"' in src
    stage = "kGateUp" if config.stage == "w13" else "kDown"
    element = "cutlass::half_t" if config.dtype == "f16" else "cutlass::bfloat16_t"
    assert re.search(rf"MoeGemv<{re.escape(element)}, {config.bits}, mixed_gemm::MoeStage::{stage}, {config.strips},\s+"
                     rf"{config.warps[0]}, {config.warps[1]}, {config.unroll}>;", src)
    for expr, value in (("Kernel::kThreads", config.threads), ("Kernel::kRows", config.rows),
                        ("Kernel::kSmemBytes", config.smem_bytes),
                        ("sizeof(mixed_gemm::MoeGemvArgs)", MOE_GEMV_ARGS_BYTES)):
        assert f"static_assert({expr} == {value}," in src
    assert f"__launch_bounds__({config.threads}) {config.kernel_name}(mixed_gemm::MoeGemvArgs const args)" in src
    assert FAMILY.render(config.replace(splits=3, zero_mode="offset")) == src  # launch fields and zeros: one source


@pytest.mark.parametrize("stage, n, k, splits", [("w13", 2 * 768, 2048, 6), ("w13", 2 * 80, 520, 32),
                                                 ("w2", 2048, 768, 3), ("w2", 4104, 16, 4)])
def test_launch_geometry_covers_outputs_and_k(stage, n, k, splits):
    c = MoeGemvConfig(stage=stage, strips=1, warps=(4, 2), splits=splits)
    row_tiles, s, chunk, strips = c.launch_geometry(n, k)
    outputs = n // 2 if stage == "w13" else n
    katoms = -(-k // 16)
    assert strips == -(-n // 16) and row_tiles * c.rows >= outputs > (row_tiles - 1) * c.rows
    assert chunk % c.unroll == 0 and 1 <= s <= splits
    assert (s - 1) * chunk < katoms <= s * chunk  # every split has work, together they cover K


def test_can_implement_says_why():
    c = MoeGemvConfig(stage="w13")
    assert FAMILY.can_implement(c, _problem()) == (True, "")
    dense = Problem(m=1, n=4096, k=4096, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    ok, why = FAMILY.can_implement(c, dense)
    assert not ok and "not a dense matmul" in why
    ok, why = FAMILY.can_implement(c, _problem(stage="w2"))
    assert not ok and "is the w13 kernel, the problem is the w2 projection" in why
    ok, why = FAMILY.can_implement(c, _problem(inter=1000))
    assert not ok and "I = N/2 must be a multiple of 16" in why and "I=1000" in why
    ok, why = FAMILY.can_implement(c, _problem(layout="sm80"))
    assert not ok and "'sm90a' weight layout" in why and "'sm80'" in why
    ok, why = FAMILY.can_implement(c, _problem(dtype="bf16"))
    assert not ok and "f16/4-bit/int" in why
    ok, why = FAMILY.can_implement(c, _problem(top_k=0))
    assert not ok and "top_k >= 1" in why
    ok, why = FAMILY.can_implement(c, _problem(h=4100))
    assert not ok and "K must be a multiple of 8" in why
    # The zero mode is folded into the sm90a layout: a config of any mode runs every mode's weights
    # only when the problem's mode matches the config's (the base rule), as for gemv.
    assert FAMILY.can_implement(c.replace(zero_mode="sym"), _problem(zero_mode="sym"))[0]
    # The down projection has no rule on I beyond K's.
    assert FAMILY.can_implement(MoeGemvConfig(stage="w2"), _problem(stage="w2", inter=1000))[0]


@pytest.mark.parametrize("e, top_k, h, inter", PRESETS)
@pytest.mark.parametrize("bits", (4, 8))
def test_heuristic_picks_catalog_kernels_that_fit(e, top_k, h, inter, bits):
    for tokens in (1, 2, 4, 5, 16, 64, 1024, 8192):
        for stage in ("w13", "w2"):
            p = _problem(stage=stage, tokens=tokens, top_k=top_k, experts=e, h=h, inter=inter, bits=bits)
            c = FAMILY.heuristic(p, 132)
            assert c == heuristic_config(p, 132) and c.kernel_name in IDENTITIES and c.stage == stage
            assert FAMILY.can_implement(c, p) == (True, "")
            row_tiles, splits, _, _ = c.launch_geometry(p.n, p.k)
            outputs = p.n // 2 if stage == "w13" else p.n
            groups = 1 if (c.slot_loop or stage == "w13") else top_k
            slices = splits * groups
            pairs = tokens * (top_k if stage == "w13" else 1)
            planes = pairs * slices * (p.n if stage == "w13" else outputs) if slices > 1 else 0
            assert planes <= WORKSPACE_FLOATS  # split-K / slot planes stay within the cap
            if tokens == 1:  # decode: the pairs are spread over the GPU, K split to fill it
                assert not c.slot_loop and row_tiles * pairs * slices >= 132
            for s in candidate_schedules(p, 132):
                cfg = MoeGemvConfig.from_schedule(s, bits=bits)
                assert cfg.kernel_name in IDENTITIES and cfg.stage == stage and FAMILY.can_implement(cfg, p)[0]
    big = _problem(stage="w2", tokens=8192, top_k=top_k, experts=e, h=h, inter=inter, bits=bits)
    assert FAMILY.heuristic(big, 132).slot_loop == (top_k > 1)  # tokens fill the GPU: slots looped in the CTA


def test_dense_problems_get_nothing():
    dense = Problem(m=1, n=4096, k=4096, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    assert FAMILY.heuristic(dense, 132) is None and FAMILY.candidates(dense, 132) == []


def test_pair_mode_pays_while_pairs_are_a_few_times_the_experts():
    assert pays(1, 8, 128) and pays(64, 8, 128) and not pays(65, 8, 128)
    assert pays(16, 2, 8) == (32 <= PAIR_REREAD * 8) and not pays(300, 2, 4)
    assert FAMILY.pays(1, 2, 8) and not FAMILY.pays(1000, 8, 128)


def _experts(n, k, *, layout, e=4, bits=4, group=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (e, n, k), generator=gen, dtype=torch.uint8)
    groups = 1 if group == -1 else k // group
    s = torch.rand(e, n, groups, generator=gen) * 0.01 + 0.001
    z = torch.randint(0, 2**bits, (e, n, groups), generator=gen).float()
    return mg.prepack_experts(q, s, z, bits=bits, group_size=group, layout=layout)


def test_moe_picks_the_grouped_kernels_where_they_fit(monkeypatch):
    """``grouped_plan`` (what ``moe`` runs on a GPU), asked for device 0 of an H100 from the CPU:
    sm90a-layout experts get the moe_gemv heuristic's configs; what it cannot take gets the reason
    (and the per-expert path)."""
    from mixed_gemm.kernels import base
    from mixed_gemm.ops.experts import GroupedPlan, grouped_plan

    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    monkeypatch.setattr(mg.ops.experts, "GROUPED", {})
    h, inter = 128, 64
    w13, w2 = _experts(2 * inter, h, layout="sm90a"), _experts(h, inter, layout="sm90a", seed=1)
    x = torch.zeros(3, h, dtype=torch.float16)
    plan = grouped_plan(x, w13, w2, 2)
    assert isinstance(plan, GroupedPlan) and plan.family is FAMILY
    assert [c.stage for c in plan.configs] == ["w13", "w2"] and all(c.kernel_name in IDENTITIES for c in plan.configs)
    assert grouped_plan(x, w13, w2, 2) is plan and len(mg.ops.experts.GROUPED) == 1  # cached per T bucket
    assert grouped_plan(torch.zeros(4, h, dtype=torch.float16), w13, w2, 2) is plan  # the same bucket
    forced = (MoeGemvConfig(stage="w13", splits=2), MoeGemvConfig(stage="w2", slot_loop=True))
    assert grouped_plan(x, w13, w2, 2, forced).configs == forced
    with pytest.raises(ValueError, match=r"configs: expected \(gate\|up config, down config\)"):
        grouped_plan(x, w13, w2, 2, (mg.kernels.gemv.GemvConfig(), MoeGemvConfig(stage="w2")))
    bad = grouped_plan(x, w13, w2, 2, (forced[1], forced[0]))
    assert isinstance(bad, str) and "is the w2 kernel, the problem is the w13 projection" in bad
    sm80 = grouped_plan(x, _experts(2 * inter, h, layout="sm80"), _experts(h, inter, layout="sm80"), 2)
    assert isinstance(sm80, str) and sm80.startswith("moe_gemv: reads the 'sm90a' weight layout")
    odd = grouped_plan(x, _experts(2 * 40, h, layout="sm90a"), _experts(h, 40, layout="sm90a", group=-1), 2)
    assert isinstance(odd, str) and "I = N/2 must be a multiple of 16" in odd
    monkeypatch.setattr(base, "compute_capability", lambda i: (7, 5))
    monkeypatch.setattr(mg.ops.experts, "GROUPED", {})
    old = grouped_plan(x, w13, w2, 2)
    assert isinstance(old, str) and "7.5" in old
