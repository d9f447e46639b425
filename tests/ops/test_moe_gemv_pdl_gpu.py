"""moe_gemv's down kernel launched as a programmatic dependent of the gate|up kernel (PDL, sm_90+:
it starts while gate|up runs, optionally prefetches its weight slices into L2, and waits with
griddepcontrol.wait before it reads h or writes anything), on Qwen3-30B-A3B-like (E=128, top-8) and
DeepSeek-V2-Lite-like (E=64, top-6) experts with H and I reduced, at 1, 3 and 16 tokens, in pair,
expert and persistent mode (split-K on both projections: their planes and counters share the
stream's workspace, so a down CTA that wrote before the wait would corrupt gate|up's sums): each
stage against the reference, outputs poisoned with NaN first (an h read before gate|up wrote it
would be NaN); bitwise equal to the same kernels without PDL; -1 ids contribute nothing; launches
back to back on one stream without a host sync; and CUDA-graph capture (programmatic edges) with new
routing written between replays."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels.moe_gemv import MoeGemvConfig
from mixed_gemm.kernels.moe_gemv.heuristics import heuristic_config
from mixed_gemm.ops.moe_grouped import GroupedPlan, _problems, forced_schedules, grouped_plan, moe_grouped, pdl_launches
from mixed_gemm.runtime import current_stream
from test_moe_gemv_gpu import (capture_moe, check_dropped, drop_share, poisoned_outputs_and_launchers, ref_h, ref_y,
                               replay_with, routing)
from test_moe_gemv_persistent_gpu import SHAPES, case, drop_pairs, layer
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                                 reason="programmatic dependent launch needs sm_90+")]
FORCED = {"pair_split": ("w13_s2_w4x1_u8_split2", "w2_s1_w4x2_u8_split3"),
          "pair_kloop": ("w13_s1_w4x2_u8", "w2_s1_w4x2_u8_kloop"),
          "expert_split": ("w13_s1_w4x2_u8_m8_xe_split2", "w2_s1_w4x2_u8_m8_xe_split2"),
          "persistent_split": ("w13_s1_w4x2_u8_m8_pe_split3", "w2_s1_w4x2_u8_m8_pe_split2"),
          "slot_warps_split": ("w13_s1_w4x2_u8_ds", "w2_s1_w1x8_u16_ds_sw_split2")}
MODES = ["heuristic", *FORCED]


def configs_for(mode, w13, w2, t, top_k):
    zm = w13.packed.zero_mode
    if mode == "heuristic":
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        return tuple(heuristic_config(p, sms) for p in _problems(t, top_k, w13.packed, w2.packed))
    return tuple(MoeGemvConfig.from_schedule(s, zero_mode=zm) for s in FORCED[mode])


def run_stages(cfgs, x, w13, w2, weights, ids, pdl: bool, prefetch: bool = False):
    """Both kernels into NaN-poisoned outputs, the down one with ``pdl`` (and its L2 ``prefetch``): (h, y)."""
    t, k = ids.shape
    stream = current_stream(0)
    h, y, gate_up, down = poisoned_outputs_and_launchers(*cfgs, x, w2, t, k)
    assert down.pdl_capable and not gate_up.pdl_capable
    gate_up(x, w13, ids.contiguous(), None, h, t, k, stream)
    down(h, w2, ids.contiguous(), weights.float().contiguous(), y, t, k, stream, pdl=pdl, pdl_prefetch=prefetch)
    torch.cuda.synchronize()
    return h, y


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("name", list(SHAPES))
def test_pdl_matches_the_reference_and_the_launch_without_it(name, t, mode, prefetch):
    (e, top_k, h, inter), w13, w2, seed, x = case(name, t, "pdl", mode)
    weights, ids = routing(t, top_k, e, seed, ids_dtype=torch.int32 if t == 3 else torch.int64)
    cfgs = configs_for(mode, w13, w2, t, top_k)
    hk, yk = run_stages(cfgs, x, w13.packed, w2.packed, weights, ids, pdl=True, prefetch=prefetch)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written (or h read early)"
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), h)
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), inter)
    h0, y0 = run_stages(cfgs, x, w13.packed, w2.packed, weights, ids, pdl=False)
    assert torch.equal(hk, h0) and torch.equal(yk, y0)  # the same kernels and sums, PDL or not
    with pdl_launches(prefetch=prefetch):
        y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)
    assert torch.equal(y, yk)
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), inter, chained=2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("name", list(SHAPES))
def test_pdl_minus_one_and_ids_outside_contribute_nothing(name, t, mode):
    (e, top_k, h, inter), w13, w2, seed, x = case(name, t, "pdl-ep", mode)
    weights, bad, valid = drop_pairs(*routing(t, top_k, e, seed), e, seed)
    cfgs = configs_for(mode, w13, w2, t, top_k)
    hk, yk = run_stages(cfgs, x, w13.packed, w2.packed, weights, bad, pdl=True)
    assert (hk.view(t, top_k, -1)[~valid] == 0).all() and not torch.isnan(yk).any()
    if t >= 2:
        assert (yk[1] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    assert_elementwise(yk, ref_y(hk, w2.kernel, kept_ids, kept_weights), inter)
    h0, y0 = run_stages(cfgs, x, w13.packed, w2.packed, weights, bad, pdl=False)
    assert torch.equal(hk, h0) and torch.equal(yk, y0)


@pytest.mark.parametrize("mode", ["pair_split", "persistent_split"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_pdl_layers_back_to_back_without_a_host_sync(name, mode):
    """Eight layers' launches queued on one stream (each down overlapping its gate|up, each gate|up
    an ordinary launch after the previous down), then one sync: each output equals its layer alone."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    t = 3
    cfgs = configs_for(mode, w13, w2, t, top_k)
    cases = []
    for i in range(8):
        seed = seed_of("pdl-chain", name, mode, i)
        x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.float16)
        cases.append((x, *routing(t, top_k, e, seed)))
    moe_grouped(*(cases[0][0], w13.packed, w2.packed, *cases[0][1:]), configs=cfgs)  # kernels loaded, workspaces sized
    torch.cuda.synchronize()
    with pdl_launches():
        outs = [moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs) for x, weights, ids in cases]
    torch.cuda.synchronize()
    with pdl_launches(False):
        for out, (x, weights, ids) in zip(outs, cases):
            assert torch.equal(out, moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs))


@pytest.mark.parametrize("mode", ["heuristic", "pair_split", "expert_split", "persistent_split"])
@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("name", list(SHAPES))
def test_pdl_graph_capture_replays_new_routing(name, t, mode):
    """``moe`` captured with PDL on (the down launch becomes a programmatic edge); each replay finds
    new routing, weights and x -- random, a third of the pairs -1 with NaN weights, all -1 -- and
    matches the same kernels run eagerly without PDL, bitwise."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    x = torch.randn(t, h, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of("pdl-graph", name, t, 0))
    s13, s2 = (c.schedule for c in configs_for(mode, w13, w2, t, top_k))
    with forced_schedules(f"moe_gemv:{s13}", f"moe_gemv:{s2}"), pdl_launches():
        plan = grouped_plan(x, w13.packed, w2.packed, top_k)
        assert isinstance(plan, GroupedPlan) and plan.launchers()[1].pdl_capable, plan
        graph, out = capture_moe(x, w13.packed, w2.packed, weights, ids)
        for round_ in range(1, 5):
            new_w, new_ids = routing(t, top_k, e, seed_of("pdl-graph", name, t, round_))
            if round_ >= 3:
                new_w, new_ids = drop_share(new_w, new_ids, 0.35 if round_ == 3 else 1.0, round_)
            def eager():  # the same kernels, without PDL
                with pdl_launches(False):
                    return mg.moe(x, w13.packed, w2.packed, weights, ids)

            new_x = torch.randn(t, h, device="cuda").half()
            assert torch.equal(out, replay_with(graph, out, (x, weights, ids), (new_x, new_w, new_ids), eager))
            check_dropped(out, x, w13, w2, weights, ids, inter)
