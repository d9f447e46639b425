"""The grouped mma.sync MoE kernels (moe_sm80: the sm80 tile over every expert's sorted rows, the
Ampere path for many tokens per expert) on a GPU (they also run on the H100: sm_90 SASS of the same
source): every catalog tile for both stages against the float32 reference over weight kinds
(fp16/bf16, int4/int8, symmetric / integer / float zeros / offsets, groups 32/64/128/per-channel),
top-k 1/2/6/8, token counts from 1 to 300, random routing and every token on one expert (experts
without tokens), ids out of range, no tokens, determinism, and CUDA-graph capture with new routing
written between replays. Checks as in test_moe_sm90a_gpu; outputs poisoned with NaN first."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_sm80 import MoeSm80Config
from mixed_gemm.kernels.moe_sm80.catalog import SHAPES
from moe_checks import check_graph_capture, check_ids_out_of_range, check_no_tokens_and_one_token, check_sweep_case
from test_moe_gemv_gpu import TOP_KS, layer, routing
from test_sm90a_gpu import DTYPES, ZERO_KINDS
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                                 reason="needs an sm_80+ GPU (mma.sync)")]
FAMILY = family("moe_sm80")
GROUPS = (32, 64, 128, -1)


def _cfg(stage, shape, **kw):
    tile, warps, stages = shape
    return MoeSm80Config(stage=stage, tile=tile, warps=warps, stages=stages, **kw)


def _sweep_params():
    """Every catalog tile in both stages, per dtype and width (each gate|up tile with itself and with
    the next one: all 12 kernels run in both stages, twice); zero kind x group rotate through all
    combinations, top-k and T rotate, the routing is random or puts every token's slot 0 on one
    expert."""
    rng = random.Random(80)
    cases, seen = [], []
    for dtype in DTYPES:
        for bits in (4, 8):
            for i, a in enumerate(SHAPES):
                for b in (SHAPES[i], SHAPES[(i + 1) % len(SHAPES)]):
                    c = len(cases)
                    zero = ZERO_KINDS[c % 4]
                    group = min(GROUPS, key=lambda g: seen.count((zero, g)))  # the least tried combination
                    seen.append((zero, group))
                    top_k, t = TOP_KS[(c + c // 4) % 4], (1, 16, 64, 300)[(c // 2 + c // 8) % 4]
                    route = "one" if c % 3 == 0 else "random"
                    e = max(top_k + 1, rng.choice((8, 16, 32)))
                    if group == -1:
                        h, inter = 8 * rng.randrange(9, 90, 2), 8 * rng.randrange(2, 60)
                    else:
                        h, inter = group * rng.randrange(1, 8), group * rng.randrange(1, 5)
                    s13, s2 = _cfg("w13", a).schedule, _cfg("w2", b).schedule
                    cases.append(pytest.param(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route,
                                              id=f"{dtype}-u{bits}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}"
                                                 f"-h{h}-i{inter}-{route}"))
    assert {p.values[6] for p in cases} == set(TOP_KS) and {p.values[7] for p in cases} == {1, 16, 64, 300}
    assert {(p.values[4], p.values[5]) for p in cases} == {(z, g) for z in ZERO_KINDS for g in GROUPS}
    assert {p.values[2].split("_", 1)[1] for p in cases} == {_cfg("w13", s).schedule.split("_", 1)[1] for s in SHAPES}
    return cases


@pytest.mark.parametrize("dtype,bits,s13,s2,zero,group,top_k,t,e,h,inter,route", _sweep_params())
def test_sweep(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route):
    seed = seed_of("moe80", dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route)
    check_sweep_case(FAMILY, MoeSm80Config, seed, dtype, DTYPES[dtype], bits, s13, s2, zero, group, top_k, t, e, h,
                     inter, route)


def _cfgs(shape=SHAPES[0]):
    return _cfg("w13", shape), _cfg("w2", shape)


def test_ids_out_of_range_contribute_nothing():
    w13, w2 = layer(seed=8)
    check_ids_out_of_range(_cfgs(), w13, w2, "oob80")


def test_no_tokens_and_one_token():
    w13, w2 = layer(seed=8)
    check_no_tokens_and_one_token(_cfgs(), w13, w2, "one80")


def test_graph_capture_with_new_routing_between_replays():
    check_graph_capture(_cfgs(SHAPES[1]), "g80")


def test_selection_takes_it_where_moe_sm90a_does_not_run(monkeypatch):
    """With moe_sm90a unavailable (an Ampere GPU), many rows per expert go to this family, a few to
    moe_gemv; mg.moe runs the plan it reports."""
    import mixed_gemm.ops.moe_grouped as grouped
    from mixed_gemm.ops.moe_grouped import grouped_plan

    monkeypatch.setattr(family("moe_sm90a"), "supports", lambda i: (False, "not an sm_90a GPU (test)"))
    monkeypatch.setattr(grouped, "GROUPED", {})  # plans made before the patch
    w13, w2 = layer(e=8, seed=8)
    for t, name in ((256, "moe_sm80"), (4, "moe_gemv")):
        plan = grouped_plan(torch.randn(t, 256, device="cuda").half(), w13.packed, w2.packed, 2)
        assert plan.family.name == name, (t, plan)
    x = torch.randn(256, 256, device="cuda").half()
    weights, ids = routing(256, 2, 8, seed_of("sel80"))
    with mg.compile.blocking():
        y = mg.moe(x, w13.packed, w2.packed, weights, ids)
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), 128, chained=3)
