"""The moe_gemv (grouped MoE decode) family's config, rendering, argument mirror, launch geometry,
heuristics, candidates, can_implement reasons, and how ``moe`` picks it (CPU)."""
import re
from pathlib import Path

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import GROUPED_FAMILIES, MoeProblem, Problem, family, parse_schedule, qualified
from mixed_gemm.kernels.moe_gemv import FAMILY, MoeGemvConfig
from mixed_gemm.kernels.moe_gemv.abi import (MOE_GEMV_ARGS_BYTES, MOE_GEMV_FUSED_ARGS_BYTES, MoeGemvArgs,
                                            MoeGemvFusedArgs)
from mixed_gemm.kernels.moe_gemv.candidates import candidate_schedules
from mixed_gemm.kernels.moe_gemv.config import (GRID_Z, MAX_STATIC_SMEM, PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS,
                                                route_bytes)
from mixed_gemm.kernels.moe_gemv.heuristics import (EXPERT_MAX_TOKENS, EXPERT_MIN_REUSE, PAIR_REREAD,
                                                    PERSISTENT_M8_REUSE, PERSISTENT_MIN_EXPERTS, WORKSPACE_FLOATS,
                                                    by_expert, expected_experts, expert_config, heuristic_config,
                                                    launch_fields, pays, reuse)

IDENTITIES = {c.kernel_name for c in FAMILY.catalog()}
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
# (E, top_k, H, I) of the presets in mixed_gemm/benchmark/moe.py: Qwen3-30B-A3B, Mixtral, DeepSeek-V2-Lite
PRESETS = ((128, 8, 2048, 768), (8, 2, 4096, 14336), (64, 6, 2048, 1408))


def _problem(stage="w13", tokens=1, top_k=2, experts=8, h=4096, inter=1024, **kw):
    n, k = (2 * inter, h) if stage == "w13" else (h, inter)
    base = dict(tokens=tokens, top_k=top_k, experts=experts, n=n, k=k, dtype="f16", bits=4, zero_mode="int",
                group_size=128, layout="sm90a", stage=stage, gate_up=True)
    return MoeProblem(**dict(base, **kw))


@pytest.mark.parametrize("schedule", ["w13_s2_w4x1_u8", "w13_s1_w4x2_u8_split6", "w2_s2_w4x2_u8_split3_kloop",
                                      "w2_s1_w4x2_u4_kloop", "w2_s4_w2x2_u2", "w13_s1_w4x2_u8_m16_xe",
                                      "w2_s1_w4x2_u4_m8_xe_split3", "w13_s2_w2x2_u8_m8_xe_split2",
                                      "w13_s1_w4x2_u8_m16_pe_split6", "w2_s1_w4x2_u4_m8_pe", "w13_s1_w4x2_u8_ds_split2",
                                      "w2_s2_w4x2_u8_ds_split4_kloop", "w13_s1_w4x2_u8_ds_tp_split4",
                                      "w13_s2_w4x1_u8_tp", "w2_s1_w1x16_u16_ds_sw", "w2_s1_w1x8_u8_sw_split2"])
def test_schedule_round_trip_and_names(schedule):
    c = MoeGemvConfig.from_schedule(schedule, dtype="bf16", bits=8, zero_mode="float")
    assert c.schedule == schedule and qualified(c) == f"moe_gemv:{schedule}"
    assert parse_schedule(qualified(c), dtype="bf16", bits=8, zero_mode="float") == c
    k = c.kernel
    assert (k.splits, k.slot_loop, k.zero_mode) == (1, False, "int") and k.kernel == k  # launch fields, folded zeros
    tokens = 16 if "_m16_" in schedule else 8 if "_m8_" in schedule else 1
    assert (k.by_expert, k.tokens) == (c.by_expert, c.tokens) == ("_xe" in schedule, tokens)
    assert k.persistent == c.persistent == ("_pe" in schedule) and c.tiled == (tokens > 1)
    assert k.deferred == c.deferred == ("_ds" in schedule)
    assert k.touch_pages == c.touch_pages == ("_tp" in schedule)
    assert k.slot_warps == c.slot_warps == ("_sw" in schedule)
    assert c.kernel_name == k.kernel_name == f"mg_moe_bf16_u8_{k.schedule}"
    assert c.name == f"mg_moe_bf16_u8_zfloat_{schedule}"
    assert family("moe_gemv") is FAMILY and FAMILY in GROUPED_FAMILIES
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("m1_s2_w4x2_u8")
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s2_w4x1_u8_kloop_split2")  # _kloop comes last
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s2_w4x1_u8_split2_m16_xe")  # the mode comes before the split
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s2_w4x1_u8_xe")  # expert mode names its tokens
    with pytest.raises(ValueError, match=r"slot_loop \(_kloop\) is pair mode's"):
        MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m16_xe_kloop")
    with pytest.raises(ValueError, match=r"slot_loop \(_kloop\) is pair mode's"):
        MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m16_pe_kloop")
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_pe")  # persistent mode names its tokens
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_split2_ds")  # _ds comes before the split
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_tp_ds")  # _tp comes after _ds


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
    (dict(tokens=8), r"tokens must be one of \(8, 16\) in expert mode .* and 1 in pair mode"),
    (dict(by_expert=True), r"tokens must be one of \(8, 16\) in expert mode"),
    (dict(by_expert=True, tokens=32), r"tokens must be one of \(8, 16\) in expert mode"),
    (dict(stage="w2", by_expert=True, tokens=8, slot_loop=True), r"slot_loop \(_kloop\) is pair mode's"),
    (dict(persistent=True), r"tokens must be one of \(8, 16\) in expert mode .* and persistent mode"),
    (dict(persistent=True, by_expert=True, tokens=8), r"by_expert \(_xe\) and persistent \(_pe\) are two modes"),
    (dict(by_expert=True, tokens=8, deferred=True), r"deferred \(_ds: .*\) is pair mode's"),
    (dict(persistent=True, tokens=16, deferred=True), r"deferred \(_ds: .*\) is pair mode's"),
    (dict(stage="w2", touch_pages=True), r"touch_pages \(_tp: .*\) is pair mode's gate\|up"),
    (dict(by_expert=True, tokens=8, touch_pages=True), r"touch_pages \(_tp: .*\) is pair mode's gate\|up"),
    (dict(persistent=True, tokens=16, touch_pages=True), r"touch_pages \(_tp: .*\) is pair mode's gate\|up"),
    (dict(stage="w13", warps=(1, 8), slot_warps=True), r"slot_warps \(_sw: .*\) is pair mode's down"),
    (dict(stage="w2", warps=(4, 1), slot_warps=True), r"slot_warps \(_sw: .*\) .* at least two K warps"),
    (dict(stage="w2", warps=(1, 8), slot_warps=True, slot_loop=True), r"slot_warps \(_sw: .*\) .* without slot_loop"),
    (dict(stage="w2", warps=(4, 2), by_expert=True, tokens=8, slot_warps=True), r"slot_warps \(_sw: .*\) is pair mode's"),
    (dict(by_expert=True, tokens=16, strips=2, warps=(4, 2), unroll=16),
     "shared memory 84288 B above the static 49152 B"),  # 8 staged slices of 16 rows x 16 atoms
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
    ds = c.replace(deferred=True)  # the mma's C fragment: 4 accumulators per strip (token 0 in c0 and c2)
    assert (ds.accumulators, ds.smem_bytes) == (16, 1 * 4 * 16 * 32 * 4)
    # Expert mode: mma accumulators (4 per n8 tile), each warp's staged x slice, the scan's ints.
    x = MoeGemvConfig(stage="w13", strips=1, warps=(4, 2), unroll=8, tokens=16, by_expert=True)
    assert (x.threads, x.rows, x.accumulators) == (256, 64, 2 * 1 * 2 * 4)
    assert x.smem_bytes == 1 * 4 * 16 * 32 * 4 + 8 * 16 * (8 * 32 + 16) + 4 * (3 * 16 + 4 * 8)
    x8 = x.replace(stage="w2", tokens=8, unroll=4)
    assert x8.accumulators == 4 and x8.smem_bytes == 1 * 4 * 4 * 32 * 4 + 8 * 8 * (4 * 32 + 16) + 4 * (3 * 8 + 4 * 8)


def test_catalog_is_small_and_covers_every_kind_and_stage():
    cat = FAMILY.catalog()
    assert 0 < len(cat) <= 116 and len(IDENTITIES) == len(cat)
    touch = [c for c in cat if c.touch_pages]  # profile candidates: packaged only where a profile names them
    assert len(touch) == 12 and all(c.deferred and c.stage == "w13" and not c.tiled for c in touch)
    spread = [c for c in cat if c.slot_warps]  # likewise
    assert len(spread) == 16 and all(c.deferred and c.stage == "w2" and not c.tiled for c in spread)
    assert {c.kernel_name for c in FAMILY.packaged((9, 0))} == IDENTITIES - {c.kernel_name for c in touch + spread}
    assert cat[0].stage == "w13"  # tests/kernels/test_families.py builds its problem from the first config
    for dtype in ("f16", "bf16"):
        for bits in (4, 8):
            stages = {c.stage for c in cat if (c.dtype, c.bits) == (dtype, bits) and not c.by_expert}
            assert stages == {"w13", "w2"}
            expert = {(c.stage, c.tokens) for c in cat if (c.dtype, c.bits) == (dtype, bits) and c.by_expert}
            assert expert == {(st, t) for st in ("w13", "w2") for t in (8, 16)}
            pers = {(c.stage, c.tokens) for c in cat
                    if (c.dtype, c.bits) == (dtype, bits) and c.persistent and not c.fused}
            assert pers == {(st, t) for st in ("w13", "w2") for t in (8, 16)}
            fused = {c.tokens for c in cat if (c.dtype, c.bits) == (dtype, bits) and c.fused}
            assert fused == {8, 16}  # one kernel (both stages) per rows per pass
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
    assert MOE_GEMV_ARGS_BYTES == 9 * 8 + 2 * 8 + 17 * 4 + 4  # 17 ints, then tail padding to 8 bytes
    fused = (TEMPLATES / "moe_gemv" / "moe_fused.cuh").read_text()
    assert _struct_fields(fused, "MoeGemvFusedArgs") == [f for f, _ in MoeGemvFusedArgs._fields_] == ["up", "down", "sync"]
    assert MOE_GEMV_FUSED_ARGS_BYTES == 2 * MOE_GEMV_ARGS_BYTES + 8


@pytest.mark.parametrize("config", FAMILY.catalog(), ids=lambda c: c.kernel_name)
def test_every_catalog_config_renders_its_numbers(config):
    src = FAMILY.render(config)
    assert src.startswith("// Generated by mixed_gemm from templates/moe_gemv/kernel.cu.j2; do not edit.\n")
    assert f"// Kernel: {config.kernel_name}\n// Config: {config.kernel!r}\n" in src
    header = ("moe_fused.cuh" if config.fused else "moe_persistent.cuh" if config.persistent
              else "moe_slot_warps.cuh" if config.slot_warps else "moe_gemv.cuh")
    assert f'#include "moe_gemv/{header}"' in src
    stage = "kGateUp" if config.stage == "w13" else "kDown"
    element = "cutlass::half_t" if config.dtype == "f16" else "cutlass::bfloat16_t"
    struct = ("MoeGemvExpert" if config.by_expert else "MoeGemvPersistent" if config.persistent
              else "MoeGemvSlotWarps" if config.slot_warps else "MoeGemv")
    tokens = (f", {config.tokens}" if config.tiled else ", true, true" if config.touch_pages  # kDeferred, kTouchPages
              else ", true" if config.deferred else "")
    args = "MoeGemvFusedArgs" if config.fused else "MoeGemvArgs"
    if config.fused:  # both stages in one kernel
        assert re.search(rf"mixed_gemm::MoeGemvFused<{re.escape(element)}, {config.bits}, {config.strips}, "
                         rf"{config.warps[0]}, {config.warps[1]}, {config.unroll}{tokens}>;", src)
        assert "in one launch" in src.split("using Kernel")[0]
        assert f"static_assert(sizeof(mixed_gemm::MoeGemvFusedArgs) == {MOE_GEMV_FUSED_ARGS_BYTES}," in src
    else:
        assert re.search(rf"mixed_gemm::{struct}<{re.escape(element)}, {config.bits}, mixed_gemm::MoeStage::{stage}, "
                         rf"{config.strips},\s+{config.warps[0]}, {config.warps[1]}, {config.unroll}{tokens}>;", src)
        assert ("persistent mode" in src.split("using Kernel")[0]) == config.persistent
    assert ("expert mode" in src.split("using Kernel")[0]) == config.by_expert
    # Persistent mode: dynamic shared memory (its routing is sized per launch) and the routing mirror.
    assert ("extern __shared__" in src) == config.persistent
    assert ("static_assert(Kernel::route_words(3, 5) == 51," in src) == config.persistent
    for expr, value in (("Kernel::kThreads", config.threads), ("Kernel::kRows", config.rows),
                        ("Kernel::kSmemBytes", config.smem_bytes),
                        ("sizeof(mixed_gemm::MoeGemvArgs)", MOE_GEMV_ARGS_BYTES)):
        assert f"static_assert({expr} == {value}," in src
    assert f"__launch_bounds__({config.threads}) {config.kernel_name}(mixed_gemm::{args} const args)" in src
    assert FAMILY.render(config.replace(splits=3, zero_mode="offset")) == src  # launch fields and zeros: one source


@pytest.mark.parametrize("deferred", [False, True])
def test_touch_pages_is_a_template_argument_the_other_kernels_never_see(deferred):
    """``_tp`` renders ``kDeferred, kTouchPages`` after the unroll; every other pair-mode kernel keeps
    the arguments it had before the option existed. The profiler's candidates offer it beside each
    deferred gate|up pair-mode schedule."""
    plain = MoeGemvConfig(stage="w13", strips=1, warps=(4, 2), unroll=8, deferred=deferred)
    touch = plain.replace(touch_pages=True)
    tail = ", true, true>;" if deferred else ", false, true>;"
    src = FAMILY.render(touch)
    assert re.search(r"mixed_gemm::MoeGemv<cutlass::half_t, 4, mixed_gemm::MoeStage::kGateUp, 1,\s+4, 2, 8" +
                     re.escape(tail), src)
    assert f"__launch_bounds__(256) {touch.kernel_name}(" in src and touch.kernel_name.endswith("_tp")
    plain_tail = "4, 2, 8, true>;" if deferred else "4, 2, 8>;"
    assert plain_tail in FAMILY.render(plain) and tail not in FAMILY.render(plain)
    sched = candidate_schedules(_problem(tokens=1, top_k=2, experts=8, h=4096, inter=14336), 132)
    touched = [s for s in sched if "_tp" in s]
    assert touched and all("_ds_tp" in s and s.startswith("w13_") for s in touched)
    assert {s.replace("_tp", "") for s in touched} == {s for s in sched if s.startswith("w13_") and "_ds" in s
                                                       and "_tp" not in s and "_m" not in s}
    assert not [s for s in candidate_schedules(_problem(stage="w2", tokens=1), 132) if "_tp" in s]


@pytest.mark.parametrize("warps, top_k, slots, groups", [((1, 16), 8, 8, 1), ((1, 16), 6, 6, 1), ((1, 12), 6, 6, 1),
                                                         ((1, 8), 10, 8, 2), ((1, 16), 2, 2, 1), ((2, 8), 1, 1, 1)])
def test_slot_warps_groups_launch_and_candidates(monkeypatch, warps, top_k, slots, groups):
    """``_sw``: a CTA adds ``min(top_k, K warps)`` slots (idle warps past ``slots x (K warps //
    slots)``), grid.y = slot groups x splits, planes only past one group and one slice; the
    profiler offers the catalog's ``_sw`` shapes for the down projection of 1-8 tokens."""
    from mixed_gemm.kernels.moe_gemv import launch as launch_mod

    config = MoeGemvConfig(stage="w2", strips=1, warps=warps, unroll=16, deferred=True, slot_warps=True)
    assert config.slot_group(top_k) == (slots, groups)
    assert config.replace(slot_warps=False).slot_group(top_k) == (1, top_k)
    assert config.replace(slot_warps=False, slot_loop=True).slot_group(top_k) == (top_k, 1)
    asked = {}
    monkeypatch.setattr(launch_mod, "workspace", lambda dev, stream, n: asked.setdefault("planes", n) and 4096)
    monkeypatch.setattr(launch_mod, "semaphores", lambda dev, stream, n: asked.setdefault("counters", n) and 8192)
    h, inter, tokens = 256, 128, 3
    w = _experts(h, inter, layout="sm90a", e=max(8, top_k), group=64)
    for splits in (1, 2):
        asked.clear()
        launcher, fake = _fake_launcher(config.replace(splits=splits))
        x, ids, weights, out = _call_args("w2", tokens, top_k, inter, h, inter)
        launcher(x, w, ids, weights, out, tokens, top_k, stream=0)
        row_tiles, s, _, _ = config.replace(splits=splits).launch_geometry(h, inter)
        assert [g for g, _ in fake.launches] == [(row_tiles, groups * s, tokens)]
        assert fake.launches[0][1]["slots"] == slots
        want = (tokens * groups * s * h, tokens * row_tiles) if groups * s > 1 else None
        assert (None if not asked else (asked["planes"], asked["counters"])) == want
    down = candidate_schedules(_problem(stage="w2", tokens=1, top_k=8, experts=128, h=2048, inter=768), 132)
    spread = {s.split("_split")[0] for s in down if "_sw" in s}
    assert spread == {c.schedule for c in FAMILY.catalog() if c.slot_warps and (c.dtype, c.bits) == ("f16", 4)}
    assert not [s for s in candidate_schedules(_problem(stage="w2", tokens=16, top_k=8), 132) if "_sw" in s]
    assert not [s for s in candidate_schedules(_problem(stage="w2", tokens=1, top_k=1), 132) if "_sw" in s]
    assert not [s for s in candidate_schedules(_problem(stage="w13", tokens=1), 132) if "_sw" in s]


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
            assert not c.persistent  # off by default: slower where measured (heuristics.py)
            c = heuristic_config(p, 132, persistent_mode=True)
            assert c.kernel_name in IDENTITIES and FAMILY.can_implement(c, p) == (True, "")
            assert c.by_expert == (by_expert(p) and not c.persistent)
            assert c.persistent == (e >= 16 and tokens <= 256)  # many small experts: persistent mode
            if c.tiled:  # planes per (pair, slice): gate|up under split-K, down whenever a token has 2+
                assert c.tokens in (8, 16) and not c.slot_loop
                planes = p.pairs * splits * p.n if (splits > 1 or (stage == "w2" and top_k > 1)) else 0
            else:
                groups = 1 if (c.slot_loop or stage == "w13") else top_k
                slices = splits * groups
                pairs = tokens * (top_k if stage == "w13" else 1)
                planes = pairs * slices * (p.n if stage == "w13" else outputs) if slices > 1 else 0
            assert planes <= WORKSPACE_FLOATS  # split-K / slot planes stay within the cap
            if tokens == 1 and c.persistent:  # items: k touched experts x row tiles x K slices fill the GPU
                assert row_tiles * top_k * splits >= 132
            elif tokens == 1:  # decode: the pairs are spread over the GPU, K split to fill it
                slices = splits * (1 if stage == "w13" else top_k)
                assert not c.by_expert and not c.slot_loop and row_tiles * top_k * slices >= 132
            for s in candidate_schedules(p, 132):
                cfg = MoeGemvConfig.from_schedule(s, bits=bits)
                assert cfg.kernel_name in IDENTITIES and cfg.stage == stage and FAMILY.can_implement(cfg, p)[0]
    big = _problem(stage="w2", tokens=8192, top_k=top_k, experts=e, h=h, inter=inter, bits=bits)
    # Too many per-pair planes for expert mode's down kernel: pair mode, the slots looped in the CTA.
    assert not FAMILY.heuristic(big, 132).by_expert and FAMILY.heuristic(big, 132).slot_loop == (top_k > 1)


def test_dense_problems_get_nothing():
    dense = Problem(m=1, n=4096, k=4096, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    assert FAMILY.heuristic(dense, 132) is None and FAMILY.candidates(dense, 132) == []


def test_grouped_path_pays_for_decode_sizes_and_while_pair_mode_rereads_little():
    # Every decode-size T (expert mode reads a routed expert about once per 16 of its pairs) ...
    assert all(pays(t, k, e) for t in (1, 4, 16, 64, 65, EXPERT_MAX_TOKENS) for k, e in ((8, 128), (2, 8), (6, 64)))
    # ... and beyond it while pair mode's re-reads stay few; then the per-expert loop.
    assert pays(4096, 8, 8192) == (4096 * 8 <= PAIR_REREAD * 8192) and not pays(300, 2, 4)
    assert FAMILY.pays(1, 2, 8) and FAMILY.pays(256, 8, 128) and not FAMILY.pays(1000, 8, 128)


@pytest.mark.parametrize("e, top_k, h, inter, first", [(8, 2, 4096, 14336, 4), (16, 2, 4096, 1024, 8)])
def test_expert_mode_from_a_few_pairs_per_routed_expert(e, top_k, h, inter, first):
    """Few large experts (Mixtral; the persistent mode below takes many small ones): pair mode at one
    token (k distinct experts: one pass each either way) and while a routed expert expects fewer than
    EXPERT_MIN_REUSE pairs; expert mode from there on (the presets' first power-of-two T is in the
    heuristics docstring), 8-token chunks while the mean is at most 4, then 16."""
    for tokens in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for stage in ("w13", "w2"):
            p = _problem(stage=stage, tokens=tokens, top_k=top_k, experts=e, h=h, inter=inter)
            if e >= PERSISTENT_MIN_EXPERTS:  # the rule itself, with persistent mode out of the way
                c = launch_fields(expert_config(p), p, 132) if by_expert(p) else None
                assert (c is not None) == (tokens >= first), (tokens, stage)
                continue
            c = FAMILY.heuristic(p, 132)
            assert c.by_expert == (tokens >= first), (tokens, stage)
            assert c.by_expert == (tokens >= 2 and reuse(p) >= EXPERT_MIN_REUSE)
            if c.by_expert:
                assert c.tokens == (8 if reuse(p) <= 4 else 16)
    one = _problem(tokens=1, top_k=8, experts=8)  # every expert in every token: reuse 1 at T = 1 only
    assert reuse(one) == pytest.approx(1) and not FAMILY.heuristic(one, 132).by_expert
    assert FAMILY.heuristic(_problem(tokens=2, top_k=8, experts=8), 132).by_expert


def test_expert_mode_grid_and_can_implement():
    c = MoeGemvConfig(stage="w2", strips=1, warps=(4, 2), tokens=16, by_expert=True)
    # grid.z = experts x chunk slots: ceil(T / tokens) (an expert's most pairs with distinct experts
    # per token), at least 1, capped by CUDA's grid.z limit (the CTAs stride over the rest).
    assert [c.expert_chunks(t, 8) for t in (0, 1, 16, 17, 64, 256)] == [1, 1, 1, 2, 4, 16]
    assert c.expert_chunks(10**6, 128) == GRID_Z // 128 and 128 * c.expert_chunks(10**6, 128) <= GRID_Z
    assert FAMILY.can_implement(c, _problem(stage="w2", tokens=64)) == (True, "")
    ok, why = FAMILY.can_implement(c, _problem(stage="w2", experts=GRID_Z + 1))
    assert not ok and "expert mode (_xe): at most 65535 experts" in why
    ok, why = FAMILY.can_implement(c, _problem(stage="w2", tokens=2**27 + 1, top_k=8))
    assert not ok and "expert mode (_xe): at most 1073741824 (token, slot) pairs" in why
    assert FAMILY.can_implement(c.replace(by_expert=False, tokens=1), _problem(stage="w2", experts=GRID_Z + 1))[0]


class _FakeKernel:
    """Stands in for a loaded kernel: records the launches and their argument blocks' fields (and
    each launch's ``pdl`` in ``pdl``)."""

    def __init__(self):
        import threading
        self.lock, self.launches, self.pdl = threading.Lock(), [], []

    def block(self):
        args = MoeGemvArgs()
        return args, 0

    def launch(self, grid, stream, argv, smem=None, pdl=False):
        a = self.current
        self.pdl.append(pdl)
        self.launches.append((grid, {f: getattr(a, f) for f, _ in MoeGemvArgs._fields_}))


def _fake_launcher(config, fake=None):
    """A MoeGemvLauncher over a fake kernel that records each launch's grid and argument block."""
    from mixed_gemm.kernels.moe_gemv.launch import MoeGemvLauncher

    launcher = MoeGemvLauncher.__new__(MoeGemvLauncher)
    launcher.config, launcher.device_index, launcher._blocks = config, 0, {}
    fake = launcher.fn = fake or _FakeKernel()
    orig_block = fake.block

    def block():
        args, argv = orig_block()
        fake.current = args
        return args, argv

    fake.block = block
    return launcher, fake


def _call_args(stage, tokens, top_k, k, h, inter):
    """(x, ids, weights, out) of one projection's launch (contents unused)."""
    x = torch.zeros(tokens * (top_k if stage == "w2" else 1), k, dtype=torch.float16)
    ids = torch.zeros(tokens, top_k, dtype=torch.int32)
    weights = torch.ones(tokens, top_k) if stage == "w2" else None
    out = torch.zeros(tokens * top_k, inter) if stage == "w13" else torch.zeros(tokens, h)
    return x, ids, weights, out


@pytest.mark.parametrize("stage, splits, top_k", [("w13", 1, 2), ("w13", 3, 2), ("w2", 1, 1), ("w2", 1, 8),
                                                  ("w2", 2, 1)])
def test_expert_mode_launch_sizes_grid_and_workspace_from_shapes(monkeypatch, stage, splits, top_k):
    """The launcher's expert-mode branch, with the kernel and the workspaces faked (no GPU): one
    launch over (row tiles, splits, experts x chunks), planes and counters sized from shapes only."""
    from mixed_gemm.kernels.moe_gemv import launch as launch_mod

    asked = {}
    monkeypatch.setattr(launch_mod, "workspace", lambda dev, stream, n: asked.setdefault("planes", n) and 4096)
    monkeypatch.setattr(launch_mod, "semaphores", lambda dev, stream, n: asked.setdefault("counters", n) and 8192)
    e, h, inter, tokens = 8, 256, 128, 20
    n, k = (2 * inter, h) if stage == "w13" else (h, inter)
    w = _experts(n, k, layout="sm90a", e=e, group=64)
    config = MoeGemvConfig(stage=stage, strips=1, warps=(4, 2), tokens=16, by_expert=True, splits=splits)
    launcher, fake = _fake_launcher(config)
    x, ids, weights, out = _call_args(stage, tokens, top_k, k, h, inter)
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0)
    row_tiles, s, _, _ = config.launch_geometry(n, k)
    assert [g for g, _ in fake.launches] == [(row_tiles, s, e * 2)]  # ceil(20 / 16) chunk slots per expert
    fields = fake.launches[0][1]
    got = (fields["chunks"], fields["tokens"], fields["top_k"], fields["z0"], fields["ids_64"])
    assert got == (2, tokens, top_k, 0, 0)
    assert (bool(fields["workspace"]), bool(fields["counters"])) == ((asked or {}).get("planes") is not None,) * 2
    pairs = tokens * top_k
    if stage == "w13":
        want = (pairs * s * n, pairs * row_tiles) if s > 1 else None
    else:
        want = (pairs * s * n, tokens * row_tiles) if top_k * s > 1 else None
    assert (None if not asked else (asked["planes"], asked["counters"])) == want
    launcher(x[:0], w, ids[:0], None if weights is None else weights[:0], out[:0], 0, top_k, stream=0)
    assert len(fake.launches) == 1  # T = 0: no launch


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
    from mixed_gemm.ops.moe_grouped import GroupedPlan, grouped_plan

    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    monkeypatch.setattr(mg.ops.moe_grouped, "GROUPED", {})
    h, inter = 128, 64
    w13, w2 = _experts(2 * inter, h, layout="sm90a"), _experts(h, inter, layout="sm90a", seed=1)
    x = torch.zeros(3, h, dtype=torch.float16)
    plan = grouped_plan(x, w13, w2, 2)
    assert isinstance(plan, GroupedPlan) and plan.family is FAMILY
    assert [c.stage for c in plan.configs] == ["w13", "w2"] and all(c.kernel_name in IDENTITIES for c in plan.configs)
    assert grouped_plan(x, w13, w2, 2) is plan and len(mg.ops.moe_grouped.GROUPED) == 1  # cached per T bucket
    assert grouped_plan(torch.zeros(4, h, dtype=torch.float16), w13, w2, 2) is plan  # the same bucket
    forced = (MoeGemvConfig(stage="w13", splits=2), MoeGemvConfig(stage="w2", slot_loop=True))
    assert grouped_plan(x, w13, w2, 2, forced).configs == forced
    assert grouped_plan(x, w13, w2, 2, list(forced)) is grouped_plan(x, w13, w2, 2, forced)  # cached: launchers once
    assert grouped_plan(x, w13, w2, 2) is plan  # beside the plan moe picks
    with pytest.raises(ValueError, match=r"configs: expected \(gate\|up config, down config\)"):
        grouped_plan(x, w13, w2, 2, (mg.kernels.gemv.GemvConfig(), MoeGemvConfig(stage="w2")))
    bad = grouped_plan(x, w13, w2, 2, (forced[1], forced[0]))
    assert isinstance(bad, str) and "is the w2 kernel, the problem is the w13 projection" in bad
    sm80 = grouped_plan(x, _experts(2 * inter, h, layout="sm80"), _experts(h, inter, layout="sm80"), 2)
    assert isinstance(sm80, str) and "moe_gemv: reads the 'sm90a' weight layout" in sm80
    odd = grouped_plan(x, _experts(2 * 40, h, layout="sm90a"), _experts(h, 40, layout="sm90a", group=-1), 2)
    assert isinstance(odd, str) and "I = N/2 must be a multiple of 16" in odd
    monkeypatch.setattr(base, "compute_capability", lambda i: (7, 5))
    monkeypatch.setattr(mg.ops.moe_grouped, "GROUPED", {})
    old = grouped_plan(x, w13, w2, 2)
    assert isinstance(old, str) and "7.5" in old


def test_persistent_mode_sizes_and_routing_area():
    """Persistent mode: expert mode's reduction and staged slices plus the chunk's rows (static part),
    and the routing area per launch (route_bytes mirrors MoeGemvPersistent::route_words)."""
    c = MoeGemvConfig(stage="w13", strips=1, warps=(4, 2), unroll=8, tokens=16, persistent=True)
    assert c.tiled and (c.threads, c.rows, c.accumulators) == (256, 64, 2 * 1 * 2 * 4)
    assert c.smem_bytes == 1 * 4 * 16 * 32 * 4 + 8 * 16 * (8 * 32 + 16) + 4 * 4 * 16
    assert route_bytes(3, 5) == 4 * 51 and route_bytes(128, 2048) == 4 * (130 + 129 + 128 + 34 + 2048)
    assert c.launch_smem(128, 2048) == c.smem_bytes + route_bytes(128, 2048)
    assert c.max_smem == c.launch_smem(PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS) <= 227 * 1024
    assert MoeGemvConfig().max_smem == 0  # pair mode: static shared memory
    # Items from shapes: touched experts (at most min(E, pairs)) x row tiles x K slices.
    c6 = c.replace(splits=6)
    row_tiles, splits, _, _ = c6.launch_geometry(1536, 2048)
    assert (row_tiles, splits) == (12, 6)
    assert c6.persistent_items(1, 8, 128, 1536, 2048) == 8 * 12 * 6
    assert c6.persistent_items(256, 8, 128, 1536, 2048) == 128 * 12 * 6


def test_persistent_mode_can_implement_says_why():
    c = MoeGemvConfig(stage="w2", strips=1, warps=(4, 2), tokens=8, persistent=True)
    assert FAMILY.can_implement(c, _problem(stage="w2", tokens=256, top_k=8, experts=128)) == (True, "")
    ok, why = FAMILY.can_implement(c, _problem(stage="w2", tokens=1025, top_k=8, experts=128))
    assert not ok and f"persistent mode (_pe): at most {PERSISTENT_MAX_PAIRS} (token, slot) pairs" in why
    ok, why = FAMILY.can_implement(c, _problem(stage="w2", experts=PERSISTENT_MAX_EXPERTS + 1))
    assert not ok and f"persistent mode (_pe): at most {PERSISTENT_MAX_EXPERTS} experts" in why
    ok, why = FAMILY.can_implement(c, _problem(stage="w2", top_k=33, experts=64))
    assert not ok and "persistent mode (_pe): top_k at most 32" in why
    # The other modes keep their own bounds.
    assert FAMILY.can_implement(c.replace(persistent=False, by_expert=True),
                                _problem(stage="w2", tokens=1025, top_k=8, experts=128))[0]


@pytest.mark.parametrize("e, top_k, h, inter", [(128, 8, 2048, 768), (64, 6, 2048, 1408)])
def test_many_small_experts_take_persistent_mode_at_1_to_256_tokens(e, top_k, h, inter):
    """With persistent mode on (off by default), Qwen3-30B-A3B and DeepSeek-V2-Lite shapes: persistent
    mode at 1..256 tokens for both projections, 8-token passes while a touched expert expects at most
    PERSISTENT_M8_REUSE pairs, K split so the expected items fill 4 CTAs per SM; above 256 tokens the
    older modes (kept) take over."""
    for tokens in (1, 3, 16, 64, 256):
        for stage in ("w13", "w2"):
            p = _problem(stage=stage, tokens=tokens, top_k=top_k, experts=e, h=h, inter=inter)
            assert not FAMILY.heuristic(p, 132).persistent
            c = heuristic_config(p, 132, persistent_mode=True)
            assert c.persistent and not c.by_expert and c.kernel_name in IDENTITIES, (tokens, stage, c)
            assert c.tokens == (8 if reuse(p) <= PERSISTENT_M8_REUSE else 16)
            row_tiles, splits, _, _ = c.launch_geometry(p.n, p.k)
            active = expected_experts(tokens, top_k, e)
            assert active * row_tiles * splits >= 4 * 132 or splits == c.steps(p.k)
            assert p.pairs * splits * p.n <= WORKSPACE_FLOATS
            names = candidate_schedules(p, 132)
            assert c.schedule in names and any("_pe" in n for n in names)
    big = _problem(tokens=512, top_k=top_k, experts=e, h=h, inter=inter)
    assert not heuristic_config(big, 132, persistent_mode=True).persistent
    mixtral = _problem(tokens=1, top_k=2, experts=8, h=4096, inter=14336)
    assert not heuristic_config(mixtral, 132, persistent_mode=True).persistent  # few large experts: pair mode
    assert any("_pe" in n for n in candidate_schedules(mixtral, 132))  # ... but the profiler may try it


@pytest.mark.parametrize("stage, splits, top_k, tokens", [("w13", 1, 8, 1), ("w13", 4, 8, 3), ("w2", 1, 1, 5),
                                                          ("w2", 3, 6, 16), ("w2", 1, 8, 256)])
def test_persistent_launch_sizes_grid_smem_and_workspace_from_shapes(monkeypatch, stage, splits, top_k, tokens):
    """The launcher's persistent branch with the kernel, the workspaces and the occupancy faked (no
    GPU): one launch of min(items, resident CTAs) along x, the routing's shared memory for (E, pairs),
    planes and counters sized from shapes only."""
    from mixed_gemm.kernels.moe_gemv import launch as launch_mod

    asked = {}
    monkeypatch.setattr(launch_mod, "workspace", lambda dev, stream, n: asked.setdefault("planes", n) and 4096)
    monkeypatch.setattr(launch_mod, "semaphores", lambda dev, stream, n: asked.setdefault("counters", n) and 8192)
    monkeypatch.setattr(launch_mod, "sm_count", lambda dev: 132)
    e, h, inter = 16, 256, 128
    n, k = (2 * inter, h) if stage == "w13" else (h, inter)
    w = _experts(n, k, layout="sm90a", e=e, group=64)
    config = MoeGemvConfig(stage=stage, strips=1, warps=(4, 2), tokens=8, persistent=True, splits=splits)
    launcher, fake = _fake_launcher(config)
    launcher._resident, launcher._persistent = {}, {}
    occupancy_asked = []
    fake.occupancy = lambda smem: occupancy_asked.append(smem) or 2
    sizes = []
    fake.launch = lambda grid, stream, argv, smem=None, pdl=False: (sizes.append(smem), fake.launches.append((grid, {
        f: getattr(fake.current, f) for f, _ in MoeGemvArgs._fields_})))
    x, ids, weights, out = _call_args(stage, tokens, top_k, k, h, inter)
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0)
    row_tiles, s, _, _ = config.launch_geometry(n, k)
    pairs = tokens * top_k
    items = min(e, pairs) * row_tiles * s
    assert [g for g, _ in fake.launches] == [(min(items, 2 * 132), 1, 1)]
    assert sizes == [config.smem_bytes + route_bytes(e, pairs)]
    fields = fake.launches[0][1]
    assert (fields["chunks"], fields["tokens"], fields["top_k"], fields["z0"], fields["splits"]) == \
        (1, tokens, top_k, 0, s)
    if stage == "w13":
        want = (pairs * s * n, pairs * row_tiles) if s > 1 else None
    else:
        want = (pairs * s * n, tokens * row_tiles) if top_k * s > 1 else None
    assert (None if not asked else (asked["planes"], asked["counters"])) == want
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0)  # again: the same launch, nothing asked anew
    assert fake.launches[1] == fake.launches[0] and sizes[1] == sizes[0] and len(occupancy_asked) == 1
    launcher(x[:0], w, ids[:0], None if weights is None else weights[:0], out[:0], 0, top_k, stream=0)
    assert len(fake.launches) == 2  # T = 0: no launch


def test_one_launch_mode_names_sizes_and_pairs():
    """``_pe1``: persistent mode with both projections in one kernel. The schedule keeps its stage
    (a profile stores one per projection); the compiled identity is stage-free, so the gate|up and
    down configs of a plan load the same kernel; its shared memory is the larger stage's plus the
    claimed item. plan_rules pairs them: both _pe1, one kernel."""
    up = MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m8_pe1_split6", dtype="bf16", bits=8, zero_mode="float")
    down = MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m8_pe1_split3", dtype="bf16", bits=8, zero_mode="float")
    assert up.fused and up.persistent and down.fused and up.schedule == "w13_s1_w4x2_u8_m8_pe1_split6"
    assert qualified(down) == "moe_gemv:w2_s1_w4x2_u8_m8_pe1_split3"
    assert up.kernel == down.kernel and up.kernel.stage == "w13" and up.kernel.splits == 1
    assert up.kernel_name == down.kernel_name == "mg_moe_bf16_u8_s1_w4x2_u8_m8_pe1" in {
        c.kernel_name for c in FAMILY.catalog() if c.fused} | {"mg_moe_bf16_u8_s1_w4x2_u8_m8_pe1"}
    assert up.name == "mg_moe_bf16_u8_zfloat_w13_s1_w4x2_u8_m8_pe1_split6"
    parts = [up.replace(fused=False, stage=s).smem_bytes for s in ("w13", "w2")]
    assert up.smem_bytes == down.smem_bytes == max(parts) + 16
    assert up.max_smem == up.launch_smem(PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS) <= 227 * 1024
    assert not MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m8_pe").fused
    with pytest.raises(ValueError, match=r"fused \(_pe1: both projections in one launch\) is a persistent mode"):
        MoeGemvConfig(stage="w13", strips=1, warps=(4, 2), tokens=8, by_expert=True, fused=True)
    with pytest.raises(ValueError, match="not a moe_gemv schedule"):
        MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_pe1")  # names its tokens
    assert FAMILY.plan_rules((up, down)) == (True, "")
    assert FAMILY.plan_rules((up.replace(fused=False), down.replace(fused=False))) == (True, "")
    ok, why = FAMILY.plan_rules((up, down.replace(fused=False)))
    assert not ok and "must both be _pe1" in why
    ok, why = FAMILY.plan_rules((up, down.replace(tokens=16)))
    assert not ok and "must share one kernel" in why
    # The heuristics never take it (a profile or a forced schedule does); the per-projection
    # candidates cannot time it alone.
    for tokens in (1, 16, 256):
        for stage in ("w13", "w2"):
            p = _problem(stage=stage, tokens=tokens, top_k=8, experts=128, h=2048, inter=768)
            assert not heuristic_config(p, 132, persistent_mode=True).fused
            assert not any("_pe1" in n for n in candidate_schedules(p, 132))


def test_forced_one_launch_plan_and_mismatched_pairs(monkeypatch):
    from mixed_gemm.kernels import base
    from mixed_gemm.ops.moe_grouped import GroupedPlan, forced_schedules, grouped_plan

    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    h, inter = 128, 64
    w13 = _experts(2 * inter, h, layout="sm90a", e=16)
    w2 = _experts(h, inter, layout="sm90a", e=16, seed=1)
    x = torch.zeros(3, h, dtype=torch.float16)
    with forced_schedules("moe_gemv:w13_s1_w4x2_u8_m8_pe1_split2", "moe_gemv:w2_s1_w4x2_u8_m8_pe1"):
        plan = grouped_plan(x, w13, w2, 2)
        assert isinstance(plan, GroupedPlan) and all(c.fused for c in plan.configs)
    with forced_schedules("moe_gemv:w13_s1_w4x2_u8_m8_pe1", "moe_gemv:w2_s1_w4x2_u8_m8_pe"):
        with pytest.raises(ValueError, match="must both be _pe1"):
            grouped_plan(x, w13, w2, 2)
    with forced_schedules("moe_gemv:w13_s1_w4x2_u8_m8_pe1", "moe_gemv:w2_s1_w4x2_u8_m16_pe1"):
        with pytest.raises(ValueError, match="must share one kernel"):
            grouped_plan(x, w13, w2, 2)


class _FakeFusedKernel(_FakeKernel):
    def block(self):
        return MoeGemvFusedArgs(), 0

    def launch(self, grid, stream, argv, smem=None, pdl=False):
        a = self.current
        fields = {part: {f: getattr(getattr(a, part), f) for f, _ in MoeGemvArgs._fields_} for part in ("up", "down")}
        self.launches.append((grid, smem, a.sync, fields))


@pytest.mark.parametrize("s13, s2, top_k, tokens", [(1, 1, 8, 1), (6, 3, 8, 1), (2, 1, 1, 5), (1, 2, 6, 16)])
def test_one_launch_sizes_grid_smem_and_scratch_from_shapes(monkeypatch, s13, s2, top_k, tokens):
    """launch_layer with the kernel, the workspaces and the occupancy faked (no GPU): one launch of
    min(both projections' items, resident CTAs), the routing's shared memory, gate|up planes then
    down planes, the queue and per-expert counts then both projections' counters, the two argument
    blocks filled from their own weights and splits; run_grouped calls it instead of two launches."""
    from mixed_gemm.kernels.moe_gemv import launch as launch_mod
    from mixed_gemm.ops import moe_grouped

    asked = []
    monkeypatch.setattr(launch_mod, "workspace", lambda dev, stream, n: asked.append(("planes", n)) or 4096)
    monkeypatch.setattr(launch_mod, "semaphores", lambda dev, stream, n: asked.append(("ints", n)) or 8192)
    monkeypatch.setattr(launch_mod, "sm_count", lambda dev: 132)
    e, h, inter = 16, 256, 128
    w13 = _experts(2 * inter, h, layout="sm90a", e=e, group=64)
    w2 = _experts(h, inter, layout="sm90a", e=e, group=64, seed=1)
    up = MoeGemvConfig(stage="w13", strips=1, warps=(4, 2), tokens=8, persistent=True, fused=True, splits=s13)
    down = up.replace(stage="w2", splits=s2)
    launcher, fake = _fake_launcher(up, _FakeFusedKernel())
    launcher._resident, launcher._persistent = {}, {}
    fake.occupancy = lambda smem: 2
    down_launcher, _ = _fake_launcher(down)
    x = torch.zeros(tokens, h, dtype=torch.float16)
    ids = torch.zeros(tokens, top_k, dtype=torch.int64)
    weights = torch.ones(tokens, top_k)
    hbuf, y = torch.zeros(tokens * top_k, inter, dtype=torch.float16), torch.zeros(tokens, h, dtype=torch.float16)
    monkeypatch.setattr(moe_grouped, "current_stream", lambda dev: 0)
    out = moe_grouped.run_grouped((launcher, down_launcher), x, w13, w2, weights, ids)
    assert out.shape == (tokens, h)
    pairs = tokens * top_k
    rt13, sp13, _, _ = up.launch_geometry(w13.n, w13.k)
    rt2, sp2, _, _ = down.launch_geometry(w2.n, w2.k)
    items = min(e, pairs) * (rt13 * sp13 + rt2 * sp2)
    assert len(fake.launches) == 1
    grid, smem, sync, fields = fake.launches[0]
    assert grid == (min(items, 2 * 132), 1, 1) and smem == up.smem_bytes + route_bytes(e, pairs)
    planes13 = pairs * sp13 * w13.n if sp13 > 1 else 0
    planes2 = pairs * sp2 * w2.n if top_k * sp2 > 1 else 0
    counters13 = pairs * rt13 if sp13 > 1 else 0
    counters2 = tokens * rt2 if top_k * sp2 > 1 else 0
    want = ([("planes", planes13 + planes2)] if planes13 + planes2 else []) + [("ints", 1 + e + counters13 + counters2)]
    assert asked == want and sync == 8192
    u, d = fields["up"], fields["down"]
    assert (u["n"], u["k"], u["splits"], d["n"], d["k"], d["splits"]) == (w13.n, w13.k, sp13, w2.n, w2.k, sp2)
    assert u["weights"] is None and d["weights"] == weights.data_ptr() and u["y"] == d["x"]  # h between them
    assert (u["workspace"], d["workspace"]) == ((4096 if planes13 else None), (4096 + 4 * planes13 if planes2 else None))
    assert (u["counters"], d["counters"]) == ((8192 + 4 * (1 + e) if counters13 else None),
                                              (8192 + 4 * (1 + e + counters13) if counters2 else None))
    assert all(f["tokens"] == tokens and f["top_k"] == top_k and f["ids_64"] == 1 for f in (u, d))
    with pytest.raises(RuntimeError, match="runs both projections in one kernel"):
        launcher(x, w13, ids, None, hbuf, tokens, top_k, stream=0)
    launcher.launch_layer(down_launcher, x[:0], w13, w2, ids[:0], weights[:0], hbuf[:0], y[:0], 0, top_k, 0)
    assert len(fake.launches) == 1  # no tokens: no launch


def test_layer_candidates_pair_one_launch_configs():
    """The profiler's one-launch pairs: 8 and 16 rows per pass, each projection at one slice and at
    the persistent heuristic's split, every pair one kernel; none where the persistent rules fail."""
    from mixed_gemm.kernels.moe_gemv.candidates import layer_candidates

    for tokens in (1, 16, 256):
        problems = tuple(_problem(stage=s, tokens=tokens, top_k=8, experts=128, h=2048, inter=768) for s in ("w13", "w2"))
        pairs = FAMILY.layer_candidates(problems, 132)
        assert pairs == layer_candidates(problems, 132) and 2 <= len(pairs) <= 8
        assert {s13.split("_pe1")[0][-3:] for s13, _ in pairs} == {"_m8", "m16"}
        for s13, s2 in pairs:
            cfgs = tuple(MoeGemvConfig.from_schedule(s) for s in (s13, s2))
            assert all(c.fused for c in cfgs) and FAMILY.plan_rules(cfgs)[0]
            assert all(FAMILY.can_implement(c, p)[0] for c, p in zip(cfgs, problems))
    too_many = tuple(_problem(stage=s, tokens=1025, top_k=8, experts=128) for s in ("w13", "w2"))
    assert FAMILY.layer_candidates(too_many, 132) == []


def test_profile_entries_that_do_not_pair_fall_back_to_the_heuristics(monkeypatch):
    """A profile naming a one-launch config for one projection only: the plan takes the heuristics'
    pair rather than a kernel that cannot run alone, or another family."""
    from mixed_gemm.kernels import base
    from mixed_gemm.ops import moe_grouped

    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    problems = tuple(_problem(stage=s, tokens=1, top_k=8, experts=128, h=2048, inter=768) for s in ("w13", "w2"))
    one = MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m8_pe1_split6")
    monkeypatch.setattr(moe_grouped, "_profiled", lambda fam, p, profile: one if p.stage == "w13" else None)
    plan = moe_grouped._family_plan((FAMILY,), problems, None, None, None, 0)
    assert isinstance(plan, moe_grouped.GroupedPlan) and plan.source == "heuristic"
    assert not any(c.fused for c in plan.configs)


@pytest.mark.parametrize("e, top_k, h, inter, w13", [(128, 8, 2048, 768, "w13_s1_w2x4_u8_ds"),
                                                     (64, 6, 2048, 1408, "w13_s1_w2x4_u8_ds"),
                                                     (8, 2, 4096, 14336, "w13_s1_w4x2_u8_ds")])
def test_heuristic_at_one_token_follows_the_measured_winners(e, top_k, h, inter, w13):
    """profiles/h100.json's one-token stage winners for the presets: every stage `_ds`; the 32-output
    gate|up where the 64-output grid would not exceed the SMs (the small experts); the 64-output down."""
    up = FAMILY.heuristic(_problem(tokens=1, top_k=top_k, experts=e, h=h, inter=inter), 132)
    down = FAMILY.heuristic(_problem(stage="w2", tokens=1, top_k=top_k, experts=e, h=h, inter=inter), 132)
    assert up.schedule == w13 and down.deferred and down.strips == 1 and down.warps == (4, 2)
    assert FAMILY.heuristic(_problem(stage="w2", tokens=2, top_k=top_k, experts=e, h=h, inter=inter), 132).strips == 2
