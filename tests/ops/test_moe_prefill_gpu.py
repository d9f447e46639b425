"""The prefill side of the grouped tile families on a GPU: the routing kernels (a device counting
sort, templates/common/moe_sort.cuh) of both families against the torch reference
(``moe_route.reference_routing``: a stable sort) at up to 4096 x 8 pairs with -1 and out-of-range
ids; moe_sm80's fused configs (A rows read by index, the top-k sum in the down epilogue) and the
plain ones at 1024-4096 tokens (reduced H and I, 8 to 128 experts) against the float32 reference
of the canonical experts, through both launchers (h in pair order) and moe_grouped (h handed over
sorted, one shared routing), -1 ids, determinism where the fused sum is exact (top-k <= 2), a mixed
plan (moe_sm90a gate|up, fused moe_sm80 down) and CUDA-graph capture. Outputs poisoned first."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_route import reference_routing
from mixed_gemm.kernels.moe_sm80 import MoeSm80Config
from mixed_gemm.kernels.moe_sm80.catalog import FUSED_SHAPES, SHAPES
from mixed_gemm.kernels.moe_sm90a import MoeSm90aConfig
from mixed_gemm.ops.moe_grouped import moe_grouped
from mixed_gemm.runtime import current_stream
from moe_checks import _minus_one, check_graph_capture, check_ids_out_of_range
from test_moe_gemv_gpu import Experts, layer, ref_h, ref_y, routing, run_stages
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                                 reason="needs an sm_80+ GPU (mma.sync)")]
SM90A = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _cfg(stage, shape, fused, **kw):
    tile, warps, stages = shape
    return MoeSm80Config(stage=stage, tile=tile, warps=warps, stages=stages, fused=fused, **kw)


def _launcher(cfg):
    with mg.compile.blocking():
        return family(cfg.family).launcher(cfg, 0)


ROUTE_CASES = [  # tokens, top_k, experts, -1 share, out-of-range share, ids dtype, one hot expert
    (4096, 8, 128, 0.0, 0.0, torch.int64, False),
    (4096, 6, 64, 0.2, 0.05, torch.int32, False),
    (4096, 2, 8, 0.0, 0.0, torch.int32, True),
    (1000, 4, 511, 0.1, 0.0, torch.int64, False),
    (3, 2, 4, 0.5, 0.0, torch.int64, False),
]


@pytest.mark.parametrize("fam", ["moe_sm80", "moe_sm90a"])
@pytest.mark.parametrize("tokens,top_k,experts,away,bad,ids_dtype,hot", ROUTE_CASES)
def test_routing_kernels_are_the_stable_sort(fam, tokens, top_k, experts, away, bad, ids_dtype, hot):
    if fam == "moe_sm90a" and not SM90A:
        pytest.skip("moe_sm90a runs on sm_90a")
    cfg = _cfg("w13", SHAPES[1], False) if fam == "moe_sm80" else MoeSm90aConfig()
    launcher = _launcher(cfg)
    gen = torch.Generator().manual_seed(seed_of("route", tokens, experts))
    ids = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices
    if hot:
        ids[:, 0] = 3
        ids[:, 1] = torch.where(ids[:, 1] == 3, 4, ids[:, 1])
    u = torch.rand(ids.shape, generator=gen)
    ids = ids.masked_fill(u < away, -1).masked_fill((u >= away) & (u < away + bad), experts + 1000)
    ids = ids.to("cuda", ids_dtype)
    heights = (64, 128)
    got = launcher.route(ids, experts, heights, current_stream(0))
    torch.cuda.synchronize()
    ref = reference_routing(ids.cpu(), experts, heights)
    assert torch.equal(got.order.cpu(), ref.order) and torch.equal(got.pos.cpu(), ref.pos)
    assert torch.equal(got.counts.cpu(), ref.counts) and torch.equal(got.offsets.cpu(), ref.offsets)
    assert torch.equal(got.tile_ends.cpu(), ref.tile_ends)
    # Captured: the same kernels replay with new ids written in place (nothing read on the host).
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cap = launcher.route(ids, experts, heights, current_stream(0))
    ids.copy_(ids.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_routing(ids.cpu(), experts, heights)
    assert torch.equal(cap.order.cpu(), ref.order) and torch.equal(cap.tile_ends.cpu(), ref.tile_ends)


PREFILL = [  # tokens, top_k, experts, H, I, group, (SHAPES index, fused) of gate|up and of down
    (1024, 2, 8, 512, 256, 128, (2, True), (2, True)),    # Mixtral-like
    (4096, 8, 128, 256, 128, 128, (1, True), (1, True)),  # Qwen3-like: many small experts
    (2048, 6, 64, 256, 128, 64, (1, True), (1, False)),   # DeepSeek-like, the heuristic's pairing
    (4096, 2, 8, 256, 256, 128, (2, False), (1, True)),
    (1024, 8, 32, 384, 128, 128, (0, False), (2, False)),  # the plain kernels with the counting sort
]


@pytest.mark.parametrize("tokens,top_k,e,h,inter,group,s13,s2", PREFILL)
def test_prefill_against_the_reference(tokens, top_k, e, h, inter, group, s13, s2):
    seed = seed_of("prefill", tokens, top_k, e)
    w13 = Experts(e, 2 * inter, h, dtype="f16", bits=4, zero="int", group=group, seed=seed, gate_up=True)
    w2 = Experts(e, h, inter, dtype="f16", bits=4, zero="int", group=group, seed=seed + 1000)
    cfg13, cfg2 = _cfg("w13", SHAPES[s13[0]], s13[1]), _cfg("w2", SHAPES[s2[0]], s2[1])
    f2 = s2[1]
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.float16)
    weights, ids = routing(tokens, top_k, e, seed)
    weights, ids = _minus_one(weights, ids, seed, 0.05)  # expert parallelism: some pairs elsewhere
    away = ids == -1
    kept_ids, kept_w = ids.masked_fill(away, 0), weights.masked_fill(away, 0)
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)  # h in pair order
    assert not torch.isnan(yk).any() and (hk.view(tokens, top_k, -1)[away] == 0).all()
    valid = ~away.reshape(-1)
    assert_elementwise(hk[valid], ref_h(x, w13.kernel, kept_ids, top_k)[valid], h, chained=2)
    assert_elementwise(yk, ref_y(hk, w2.kernel, kept_ids, kept_w), inter)
    assert (yk[away.all(1)] == 0).all()
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=(cfg13, cfg2))  # sorted h, one routing
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, kept_w, kept_ids)
    assert_elementwise(y, ref, inter, chained=3)
    if top_k <= 2 or not f2:  # the fused sum is exact in any order for two slots; the combine is ordered
        again = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=(cfg13, cfg2))
        assert torch.equal(y, again)


def test_fused_ids_out_of_range_contribute_nothing():
    w13, w2 = layer(seed=8)
    cfgs = (_cfg("w13", FUSED_SHAPES[0], True), _cfg("w2", FUSED_SHAPES[0], True))
    check_ids_out_of_range(cfgs, w13, w2, "oob80f")
    check_ids_out_of_range(cfgs, w13, w2, "oob80f32", ids_dtype=torch.int32)


def test_fused_graph_capture_with_new_routing_between_replays():
    check_graph_capture((_cfg("w13", FUSED_SHAPES[0], True), _cfg("w2", FUSED_SHAPES[1], True)), "g80f")
    check_graph_capture((_cfg("w13", FUSED_SHAPES[1], True), _cfg("w2", SHAPES[0], False)), "g80mix", e=128)


@pytest.mark.skipif(not SM90A, reason="moe_sm90a runs on sm_90a")
def test_mixed_plan_sm90a_gate_up_fused_sm80_down():
    """One routing (the sm90a launcher's kernels, with moe_sm80's tile prefix sums) for both."""
    tokens, top_k, e, h, inter = 2048, 4, 16, 256, 256
    w13, w2 = layer(e=e, h=h, inter=inter, group=128, seed=11)
    cfgs = (MoeSm90aConfig(stage="w13", tile=(128, 128, 64)), _cfg("w2", FUSED_SHAPES[0], True))
    x = torch.randn(tokens, h, device="cuda").half()
    weights, ids = routing(tokens, top_k, e, seed_of("mix90"))
    from mixed_gemm.ops.moe_grouped import GroupedPlan, run_grouped

    plan = GroupedPlan([family(c.family) for c in cfgs], cfgs, 0)
    with mg.compile.blocking():
        launchers = plan.launchers()
    y = run_grouped(launchers, x, w13.packed, w2.packed, weights, ids)
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(y, ref, inter, chained=3)
    sorted_only = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=(cfgs[0], MoeSm90aConfig(stage="w2")))
    assert_elementwise(sorted_only, ref, inter, chained=3)
    forced = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)  # two families through configs=
    assert_elementwise(forced, ref, inter, chained=3)
    with pytest.raises(ValueError, match="configs: expected"):
        moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs[:1])
