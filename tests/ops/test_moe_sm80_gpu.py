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
from mixed_gemm.ops.experts import _problems, moe_grouped
from test_moe_gemv_gpu import TOP_KS, Experts, layer, ref_h, ref_y, routing, run_stages
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
    w13 = Experts(e, 2 * inter, h, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed)
    w2 = Experts(e, h, inter, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed + 1000)
    zm = w13.packed.zero_mode
    cfg13 = MoeSm80Config.from_schedule(s13, dtype=dtype, bits=bits, zero_mode=zm)
    cfg2 = MoeSm80Config.from_schedule(s2, dtype=dtype, bits=bits, zero_mode=zm)
    for cfg, p in zip((cfg13, cfg2), _problems(t, top_k, w13.packed, w2.packed)):
        assert FAMILY.can_implement(cfg, p) == (True, "")
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", DTYPES[dtype])
    weights, ids = routing(t, top_k, e, seed, one_expert=3 if route == "one" else None)
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written"
    # h: the GEMM's output is rounded before silu * up (one more rounding than the reference's).
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), h, chained=2)
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), inter)
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=(cfg13, cfg2))
    assert torch.equal(y, yk)  # deterministic; and h handed over in sorted order gives the same rows
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(y, ref, inter, chained=3)


def _cfgs(w13, shape=SHAPES[0]):
    zm = w13.packed.zero_mode
    return _cfg("w13", shape, zero_mode=zm), _cfg("w2", shape, zero_mode=zm)


def test_ids_out_of_range_contribute_nothing():
    w13, w2 = layer(seed=8)
    t, top_k, e = 40, 2, w13.packed.num_experts
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of("oob80"))
    bad = ids.clone()
    bad[0, 1], bad[2, 0], bad[3, 1] = -1, e, 2**40
    bad[4, :] = -7  # a token with no valid slot: y row zero
    hk, yk = run_stages(*_cfgs(w13), x, w13.packed, w2.packed, weights, bad)
    valid = (bad >= 0) & (bad < e)
    hv = hk.view(t, top_k, -1)
    assert (hv[~valid] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    assert_elementwise(hv[valid], ref_h(x, w13.kernel, kept_ids, top_k).view(t, top_k, -1)[valid], 256, chained=2)
    assert (yk[4] == 0).all()
    assert_elementwise(yk, ref_y(hk, w2.kernel, kept_ids, kept_weights), 128)


def test_no_tokens_and_one_token():
    w13, w2 = layer(seed=8)
    cfgs = _cfgs(w13)
    x = torch.empty(0, 256, device="cuda").half()
    weights, ids = torch.empty(0, 2, device="cuda"), torch.empty(0, 2, dtype=torch.long, device="cuda")
    run_stages(*cfgs, x, w13.packed, w2.packed, weights, ids)  # no launch, no error
    assert moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs).shape == (0, 256)
    x = torch.randn(1, 256, device="cuda").half()
    weights, ids = routing(1, 2, 8, seed_of("one80"))
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)  # 6 of 8 experts without rows
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), 128, chained=3)


def test_graph_capture_with_new_routing_between_replays():
    """Captured once, replayed with new routing and new x written into the captured inputs: the
    per-expert row counts (and so the tiles each CTA finds) change every replay, nothing is read on
    the host."""
    w13, w2 = layer(e=16, seed=8)
    cfgs = _cfgs(w13, SHAPES[1])
    t, top_k = 96, 2
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, top_k, 16, seed_of("g80", 0))
    with mg.compile.blocking():
        moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)  # warm-up: load, blocks
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)
    for i in range(1, 4):
        w_new, ids_new = routing(t, top_k, 16, seed_of("g80", i), one_expert=5 if i == 2 else None)
        x.copy_(torch.randn(t, 256, generator=torch.Generator().manual_seed(i)).half().cuda())
        weights.copy_(w_new)
        ids.copy_(ids_new)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
        assert_elementwise(y, ref, 128, chained=3)
