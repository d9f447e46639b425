"""The grouped wgmma MoE kernels (moe_sm90a: CUTLASS's ptr-array mixed-input GEMM, one group per
expert) on an H100: every catalog kernel (tiles, clusters of two) in both stages and both raster
orders of the group scheduler against the float32 reference over weight
kinds (fp16/bf16, int4/int8, symmetric / integer / float zeros / offsets, groups 64/128/per-channel;
group 32 is refused with its reason), top-k 1/2/6/8, token counts from 1 to 300, random routing and
every token on one expert (experts without tokens), ids out of range, no tokens, determinism, and
CUDA-graph capture with new routing written between replays. Checks as in test_moe_gemv_gpu: each
stage against a reference of the weights exactly as the kernel forms them, the layer against
``mixed_gemm.reference.moe``; outputs poisoned with NaN first."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_sm90a import MoeSm90aConfig
from mixed_gemm.kernels.moe_sm90a.catalog import kernels_for
from mixed_gemm.ops.moe_grouped import _problems, grouped_plan
from moe_checks import check_graph_capture, check_ids_out_of_range, check_no_tokens_and_one_token, check_sweep_case
from test_moe_gemv_gpu import TOP_KS, layer, routing
from test_sm90a_gpu import DTYPES, ZERO_KINDS
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs an sm_90 GPU (wgmma)")]
FAMILY = family("moe_sm90a")
GROUPS = (64, 128, -1)


def _sweep_params():
    """Every catalog kernel in both stages, per dtype and width (each gate|up kernel with itself and
    with the kernel three further down the catalog: all 32 kernels run in both stages), the raster
    order rotating so that each kernel runs with both; zero kind x group rotate through all
    combinations (group 64 only with TK = 64 tiles), top-k and T rotate, the routing is random or
    puts every token's slot 0 on one expert."""
    rng = random.Random(90)
    cases, seen = [], []
    for dtype in DTYPES:
        for bits in (4, 8):
            kernels = kernels_for(bits)
            for i, (a, ca) in enumerate(kernels):
                for b, cb in (kernels[i], kernels[(i + 3) % len(kernels)]):
                    c = len(cases)
                    groups = GROUPS if a[2] == b[2] == 64 else (128, -1)
                    zero = ZERO_KINDS[c % 4]
                    group = min(groups, key=lambda g: seen.count((zero, g)))  # the least tried combination
                    seen.append((zero, group))
                    top_k, t = TOP_KS[(c + c // 4) % 4], (1, 16, 64, 300)[(c // 2 + c // 8) % 4]
                    route = "one" if c % 3 == 0 else "random"
                    e = max(top_k + 1, rng.choice((8, 16, 32)))
                    if group == -1:
                        h, inter = 8 * rng.randrange(9, 90, 2), 16 * rng.randrange(2, 30)
                    else:
                        h, inter = group * rng.randrange(1, 8), group * rng.randrange(1, 5)
                    r13, r2 = "mn"[c % 2], "mn"[(c // 2 + dtype.startswith("b")) % 2]
                    s13 = MoeSm90aConfig(stage="w13", tile=a, cluster=ca, raster=r13).schedule
                    s2 = MoeSm90aConfig(stage="w2", tile=b, cluster=cb, raster=r2).schedule
                    ids32 = rng.random() < 0.3
                    cases.append(pytest.param(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, ids32, route,
                                              id=f"{dtype}-u{bits}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}"
                                                 f"-h{h}-i{inter}-{route}" + ("-ids32" if ids32 else "")))
    assert {p.values[6] for p in cases} == set(TOP_KS) and {p.values[7] for p in cases} == {1, 16, 64, 300}
    assert {(p.values[4], p.values[5]) for p in cases} == {(z, g) for z in ZERO_KINDS for g in GROUPS}
    def kernel(schedule):
        c = MoeSm90aConfig.from_schedule(schedule)
        return c.tile, c.cluster, c.raster

    for at in (2, 3):  # every catalog kernel in each stage
        assert {(p.values[0], p.values[1], kernel(p.values[at])[:2]) for p in cases} == {
            (d, b, k) for d in DTYPES for b in (4, 8) for k in kernels_for(b)}
    assert {kernel(s) for p in cases for s in p.values[2:4]} == {(t, k, r) for t, k in kernels_for(4) for r in "mn"}
    return cases


@pytest.mark.parametrize("dtype,bits,s13,s2,zero,group,top_k,t,e,h,inter,ids32,route", _sweep_params())
def test_sweep(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, ids32, route):
    seed = seed_of("moe90", dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route)
    check_sweep_case(FAMILY, MoeSm90aConfig, seed, dtype, DTYPES[dtype], bits, s13, s2, zero, group, top_k, t, e, h,
                     inter, route, ids_dtype=torch.int32 if ids32 else torch.int64)


def _layer(**kwargs):
    return layer(**{"seed": 9, **kwargs})  # its own weights, not moe_gemv's tests'


def _cfgs(w13, tile=(128, 64, 64)):
    zm = w13.packed.zero_mode
    return (MoeSm90aConfig(stage="w13", tile=tile, zero_mode=zm), MoeSm90aConfig(stage="w2", tile=tile, zero_mode=zm))


def test_group_32_is_refused_with_the_rule():
    w13, w2 = _layer(group=32)
    p13, _ = _problems(64, 2, w13.packed, w2.packed)
    ok, why = FAMILY.can_implement(_cfgs(w13)[0], p13)
    assert not ok and "group size 32 is not a multiple of the tile's K=64" in why
    plan = grouped_plan(torch.empty(256, 256, device="cuda", dtype=torch.float16), w13.packed, w2.packed, 2)
    assert plan.family.name == "moe_sm80"  # the next grouped family takes it (any group of 32 and up)


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_ids_out_of_range_contribute_nothing(ids_dtype):
    w13, w2 = _layer()
    check_ids_out_of_range(_cfgs(w13), w13, w2, "oob90", ids_dtype)


def test_no_tokens_and_one_token():
    w13, w2 = _layer()
    check_no_tokens_and_one_token(_cfgs(w13), w13, w2, "one90")


def test_selection_takes_it_for_many_rows_per_expert():
    """Mixtral-like routing (E = 8, top-2): 256 tokens give 64 pairs per expert, where the heuristic
    picks this family; 4 tokens stay with moe_gemv. mg.moe runs the plan it reports."""
    w13, w2 = _layer(e=8)
    for t, name in ((256, "moe_sm90a"), (4, "moe_gemv")):
        x = torch.randn(t, 256, device="cuda").half()
        plan = grouped_plan(x, w13.packed, w2.packed, 2)
        assert plan.family.name == name, (t, plan)
    x = torch.randn(256, 256, device="cuda").half()
    weights, ids = routing(256, 2, 8, seed_of("sel90"))
    with mg.compile.blocking():
        y = mg.moe(x, w13.packed, w2.packed, weights, ids)
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), 128, chained=3)


def test_graph_capture_with_new_routing_between_replays():
    tile = (128, 32, 64)
    check_graph_capture((MoeSm90aConfig(stage="w13", tile=tile), MoeSm90aConfig(stage="w2", tile=tile)), "g90")
