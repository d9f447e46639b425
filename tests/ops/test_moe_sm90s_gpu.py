"""The grouped sm90s kernels (moe_sm90s: the dense sm90s mainloop over every expert's block of
sorted rows) on an H100: every catalog kernel in both stages, with and without a K split, against
the float32 reference over weight kinds (fp16/bf16, int4/int8, symmetric / integer / float zeros / offsets,
groups 32/64/128/per-channel), top-k 1/2/6/8, 1 to 300 tokens (and 2048: prefill), random routing and every token on
one expert, ragged N and K, a CTA per work item or a persistent grid; ids out of range, no tokens, one token and CUDA-graph capture with new
routing between replays (moe_checks), the gather kernels (``_g``: x's rows read by index), the
staged epilogue (``_se``: the tile through shared memory, stored back as whole row segments) and the combine in
the down epilogue (``_f``: the top-k sum added into fp32 rows) through the same checks.
Outputs poisoned with NaN first."""
import random

import pytest
import torch

from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_sm90s import MoeSm90sConfig
from mixed_gemm.kernels.moe_sm90s.catalog import gather_tiles, half_issue_tiles, staged_tiles, tiles_for
from moe_checks import check_graph_capture, check_ids_out_of_range, check_no_tokens_and_one_token, check_sweep_case
from test_moe_gemv_gpu import TOP_KS, layer
from test_sm90a_gpu import DTYPES, ZERO_KINDS
from weights import seed_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs an sm_90 GPU (wgmma, setmaxnreg)")]
FAMILY = family("moe_sm90s")
GROUPS = (32, 64, 128, -1)


def _case_shape(c, rng):
    """Case c's weight kind and layer: zero kind x group cycle through all 16 combinations, top-k
    and T rotate, every third case routes all tokens to one expert; N and K ragged against the
    128/256-row tiles (per-channel: K % 16 == 8 on gate|up)."""
    zero, group = ZERO_KINDS[c % 4], GROUPS[(c // 4 + c) % 4]
    top_k, t = TOP_KS[(c + c // 4) % 4], (2, 16, 64, 300)[(c // 2 + c // 8) % 4]
    route = "one" if c % 3 == 0 else "random"
    e = max(top_k + 1, rng.choice((8, 16, 32)))
    g = 128 if group == -1 else group
    if group == -1:
        h, inter = 128 * rng.randrange(1, 6) + 8, 16 * rng.randrange(2, 24)
    else:
        h, inter = g * rng.randrange(1, 6), g * rng.randrange(1, 4)
    return zero, group, top_k, t, route, e, h, inter


def _sweep_params():
    """Each catalog tile (then each half-issue one) as gate|up with itself and with the next tile as down, per dtype; the
    second case of a tile splits K (2 or 3 slices) and adds the top-k sum in the down epilogue
    (``_f``, so every tile runs down both ways); three quarters of the down kernels and a quarter of the
    gate|up ones on a persistent grid (a CTA per SM walking the items); zero kind x group cycle
    through all 16 combinations; top-k and T rotate; N and K ragged against the 128/256-row tiles."""
    rng = random.Random(91)
    cases = []
    for dtype, bits in [(d, b) for d in DTYPES for b in (4, 8)]:
        tiles = tiles_for(bits)
        # Then the half-issue kernels (_hi), each as gate|up with itself and with the next as down.
        half = [(t, True) for t in half_issue_tiles(bits)]
        for i, (a, hi) in enumerate([(t, False) for t in tiles] + half):
            group_tiles = half if hi else [(t, False) for t in tiles]
            at = group_tiles.index((a, hi))
            for j, (b, _) in enumerate(((a, hi), group_tiles[(at + 1) % len(group_tiles)])):
                c = len(cases)
                zero, group, top_k, t, route, e, h, inter = _case_shape(c, rng)
                splits = 1 + j * (1 + c % 2)
                s13 = MoeSm90sConfig(stage="w13", tile=a, splits=splits, persistent=c % 4 == 1, half_issue=hi).schedule
                s2 = MoeSm90sConfig(stage="w2", tile=b, persistent=c % 4 != 1, half_issue=hi, combine=j == 1).schedule
                cases.append(pytest.param(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route,
                                          id=f"{dtype}-u{bits}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}-h{h}-i{inter}"
                                             f"-{route}"))
    assert {p.values[6] for p in cases} == set(TOP_KS)
    assert {(p.values[4], p.values[5]) for p in cases} == {(z, g) for z in ZERO_KINDS for g in GROUPS}
    assert any(p.values[2].endswith("_p") and "_split" in p.values[2] for p in cases)  # persistent with split K
    assert any(p.values[3].endswith("_p_f") for p in cases) and any(p.values[3].endswith("_s0_f") for p in cases)
    return cases


@pytest.mark.parametrize("dtype,bits,s13,s2,zero,group,top_k,t,e,h,inter,route", _sweep_params())
def test_sweep(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route):
    seed = seed_of("moe90s", dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route)
    check_sweep_case(FAMILY, MoeSm90sConfig, seed, dtype, DTYPES[dtype], bits, s13, s2, zero, group, top_k, t, e, h,
                     inter, route)


def _gather_params():
    """Each gather tile (``_g``: gate|up reading x's rows by index) per dtype, twice: whole on a CTA
    per item and split on a persistent grid; the zero kinds and groups, top-k (1 too: a_div 1), token
    counts up to 300 (several token tiles an expert, tiles past an expert's rows), both routings, K
    ending inside a k-tile and inside a group (columns past K must read zeros)."""
    rng = random.Random(57)
    cases = []
    for dtype in DTYPES:
        for i, tile in enumerate(gather_tiles(4)):
            for j in range(2):
                c = len(cases)
                zero, group, top_k, t, route, e, h, inter = _case_shape(c, rng)
                s13 = MoeSm90sConfig(stage="w13", tile=tile, gather=True, splits=1 + 2 * j, persistent=j == 1).schedule
                s2 = MoeSm90sConfig(stage="w2", tile=tile).schedule
                cases.append(pytest.param(dtype, s13, s2, zero, group, top_k, t, e, h, inter, route,
                                          id=f"{dtype}-{s13}-{zero}-g{group}-k{top_k}-t{t}-e{e}-h{h}-i{inter}-{route}"))
    assert {p.values[5] for p in cases} == set(TOP_KS)
    return cases


@pytest.mark.parametrize("dtype,s13,s2,zero,group,top_k,t,e,h,inter,route", _gather_params())
def test_gather_reads_x_rows_by_index(dtype, s13, s2, zero, group, top_k, t, e, h, inter, route):
    seed = seed_of("moe90s-g", dtype, s13, s2, zero, group, top_k, t, e, h, inter, route)
    check_sweep_case(FAMILY, MoeSm90sConfig, seed, dtype, DTYPES[dtype], 4, s13, s2, zero, group, top_k, t, e, h,
                     inter, route)


def _staged_params():
    """Each staged-epilogue tile (``_se``) per dtype, in both stages, twice: on a CTA per item, then
    persistent with the combine in the down epilogue (the staged kernel's fp32 path); the zero
    kinds and groups, top-k, 2-300 tokens (token tiles past an expert's rows: rows not copied), both
    routings, N ragged against the tile (a row's copy clipped) and K ragged."""
    rng = random.Random(73)
    cases = []
    for dtype in DTYPES:
        for tile in staged_tiles(4):
            for j in range(2):
                c = len(cases)
                zero, group, top_k, t, route, e, h, inter = _case_shape(c, rng)
                s13 = MoeSm90sConfig(stage="w13", tile=tile, staged=True, persistent=j == 1).schedule
                s2 = MoeSm90sConfig(stage="w2", tile=tile, staged=True, persistent=j == 1, combine=j == 1).schedule
                cases.append(pytest.param(dtype, s13, s2, zero, group, top_k, t, e, h, inter, route,
                                          id=f"{dtype}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}-h{h}-i{inter}-{route}"))
    return cases


@pytest.mark.parametrize("dtype,s13,s2,zero,group,top_k,t,e,h,inter,route", _staged_params())
def test_staged_epilogue(dtype, s13, s2, zero, group, top_k, t, e, h, inter, route):
    seed = seed_of("moe90s-se", dtype, s13, s2, zero, group, top_k, t, e, h, inter, route)
    check_sweep_case(FAMILY, MoeSm90sConfig, seed, dtype, DTYPES[dtype], 4, s13, s2, zero, group, top_k, t, e, h,
                     inter, route)


@pytest.mark.parametrize("s13,s2,route", [("w13_t256x128x64_s0_p", "w2_t128x64x128_s0", "random"),
                                          ("w13_t128x64x128_s0", "w2_t256x64x128_s0_p", "one"),
                                          ("w13_t256x128x64_s0_g_p", "w2_t256x128x64_s0_p", "random"),
                                          ("w13_t256x80x128_s0_g", "w2_t256x80x128_s0_p", "one"),
                                          ("w13_t192x128x128_s0_p", "w2_t192x96x128_s0_p", "random"),
                                          ("w13_t192x64x128_s0", "w2_t192x128x128_s0_p", "one"),
                                          ("w13_t256x128x64_s0_se_p", "w2_t256x128x64_s0_se_p", "random"),
                                          ("w13_t192x128x128_s0_se", "w2_t256x64x128_s0_se_p", "one")])
def test_prefill_token_counts(s13, s2, route):
    """Prefill (2048 tokens x top-8 over 64 experts: ~256 rows an expert, or every token's slot 0 on
    one expert) on the 64/128-row token tiles the profile times from 1024 tokens on (the 192-row
    weight tiles: N = 512 and 1024 ragged against them)."""
    dtype, zero, group, top_k, t, e, h, inter = "f16", "int", 128, 8, 2048, 64, 512, 256
    seed = seed_of("moe90s-prefill", s13, s2, route)
    check_sweep_case(FAMILY, MoeSm90sConfig, seed, dtype, DTYPES[dtype], 4, s13, s2, zero, group, top_k, t, e, h,
                     inter, route)


def _cfgs(w13, tile=(128, 16, 128), gather=False):
    """The gather's gate|up goes with the combine's down (both fused), the others with neither."""
    zm = w13.packed.zero_mode
    return (MoeSm90sConfig(stage="w13", tile=tile, zero_mode=zm, gather=gather),
            MoeSm90sConfig(stage="w2", tile=tile, zero_mode=zm, combine=gather))


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("gather", [False, True])
def test_ids_out_of_range_contribute_nothing(ids_dtype, gather):
    w13, w2 = layer(seed=19)
    tile = (256, 16, 128) if gather else (128, 16, 128)
    check_ids_out_of_range(_cfgs(w13, tile, gather), w13, w2, "oob90s", ids_dtype)


def test_no_tokens_and_one_token():
    w13, w2 = layer(seed=19)
    check_no_tokens_and_one_token(_cfgs(w13), w13, w2, "one90s")


@pytest.mark.parametrize("variant", ["p", "g", "se"])
def test_graph_capture_with_new_routing_between_replays(variant):
    """Persistent, gathered, and staged (whose row stores replay with the new routing's rows)."""
    if variant == "se":
        tile = (256, 64, 128)
        configs = (MoeSm90sConfig(stage="w13", tile=tile, persistent=True, staged=True),
                   MoeSm90sConfig(stage="w2", tile=tile, staged=True))
    else:
        tile, gather = (256, 32, 128), variant == "g"
        configs = (MoeSm90sConfig(stage="w13", tile=tile, persistent=True, gather=gather),
                   MoeSm90sConfig(stage="w2", tile=tile, splits=2, combine=gather))
    check_graph_capture(configs, "g90s" + ("" if variant == "p" else "-" + variant))


@pytest.mark.parametrize("pair", [("moe_gemv:w13_s1_w4x2_u8_m8_pe", "moe_sm90s:w2_t128x16x128_s0"),
                                  ("moe_gemv:w13_s1_w4x2_u8_m8_pe", "moe_sm90s:w2_t256x32x128_s0_f"),
                                  ("moe_sm90a:w13_t128x32x64_s0", "moe_sm90s:w2_t256x32x128_s0_split2_f"),
                                  ("moe_sm90s:w13_t128x16x128_s0_p", "moe_sm90a:w2_t128x32x64_s0")],
                         ids=["gemv-pe-then-sm90s", "gemv-pe-then-sm90s-combine", "sm90a-then-sm90s-combine",
                              "sm90s-p-then-sm90a"])
def test_mixed_plans_the_profile_holds(pair):
    """Plans of two families with moe_sm90s on one side, as the H100 profile pairs them (DeepSeek at
    16 tokens, Qwen3 at 32-128): one routing for both stages, h handed over as the launchers agree."""
    import mixed_gemm as mg
    from mixed_gemm.kernels import parse_schedule
    from mixed_gemm.ops.moe_grouped import moe_grouped
    from test_moe_gemv_gpu import routing
    from tolerance import assert_elementwise

    tokens, top_k, e, h, inter = 48, 6, 32, 512, 256
    w13, w2 = layer(e=e, h=h, inter=inter, group=128, seed=23)
    zm = w13.packed.zero_mode
    cfgs = tuple(parse_schedule(s, dtype="f16", bits=4, zero_mode=zm) for s in pair)
    x = torch.randn(tokens, h, device="cuda").half()
    weights, ids = routing(tokens, top_k, e, seed_of("mix90s", *pair))
    with mg.compile.blocking():
        y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), inter, chained=3)
