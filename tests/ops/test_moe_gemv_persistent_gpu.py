"""moe_gemv's persistent mode (``_m<8|16>_pe``) on the GPU, on Qwen3-30B-A3B-like (E=128, top-8) and
DeepSeek-V2-Lite-like (E=64, top-6) experts with H and I reduced: each stage against the reference of
the kernels' own weights and the layer against the float32 reference of the canonical (q, s, z)
codes, outputs poisoned with NaN first, at 1, 3, 16, 64 and 256 tokens; the heuristic's configs and
forced ones (8 and 16 rows per pass, split-K on both projections); an expert with many more pairs
than a pass holds (several passes per item); -1 ids (expert parallelism: contribute nothing, their
NaN weights never read, a token of only -1 slots gets a zero row) and other ids outside [0, E);
determinism; and CUDA-graph capture with new routing (and -1 pairs) written between replays."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import family
from mixed_gemm.kernels.moe_gemv import MoeGemvConfig
from mixed_gemm.kernels.moe_gemv.heuristics import heuristic_config
from mixed_gemm.ops.moe_grouped import GroupedPlan, _problems, forced_schedules, grouped_plan, moe_grouped
from test_moe_gemv_gpu import Experts, capture_moe, check_dropped, drop_share, ref_h, ref_y, replay_with, routing, run_stages
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
FAMILY = family("moe_gemv")
# (name, E, top_k, H, I): the presets' expert counts and top-k, H and I reduced (multiples of the group).
SHAPES = {"qwen3": (128, 8, 512, 256), "deepseek": (64, 6, 512, 384)}
_LAYERS = {}


def layer(name):
    """The preset's w13 / w2 (int4, integer zeros, group 128), built once per module."""
    if name not in _LAYERS:
        e, _, h, inter = SHAPES[name]
        seed = seed_of("pe-layer", name)
        w13 = Experts(e, 2 * inter, h, dtype="f16", bits=4, zero="int", group=128, seed=seed, gate_up=True)
        w2 = Experts(e, h, inter, dtype="f16", bits=4, zero="int", group=128, seed=seed + 1000)
        _LAYERS[name] = (w13, w2)
    return _LAYERS[name]


def configs_for(mode, w13, w2, t, top_k):
    zm = w13.packed.zero_mode
    if mode == "heuristic":
        problems = _problems(t, top_k, w13.packed, w2.packed)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        cfgs = tuple(heuristic_config(p, sms, persistent_mode=True) for p in problems)
        assert all(c.persistent for c in cfgs), cfgs  # many small experts: persistent mode at 1..256 tokens
        return cfgs
    s13, s2 = {"m8_split3": ("w13_s1_w4x2_u8_m8_pe_split3", "w2_s1_w4x2_u8_m8_pe_split2"),
               "m16": ("w13_s1_w4x2_u8_m16_pe", "w2_s1_w4x2_u8_m16_pe"),
               "m16_split2": ("w13_s1_w4x2_u8_m16_pe_split2", "w2_s1_w4x2_u8_m16_pe_split3")}[mode]
    return MoeGemvConfig.from_schedule(s13, zero_mode=zm), MoeGemvConfig.from_schedule(s2, zero_mode=zm)


def case(name, t, *key):
    """A test's preset: its shape (E, top-k, H, I), its layer, a seed from ``key``, ``name`` and
    ``t``, and x of ``t`` tokens (fp16) from that seed."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    seed = seed_of(key[0], name, t, *key[1:])
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.float16)
    return (e, top_k, h, inter), w13, w2, seed, x


def check_layer(name, t, mode, route="random", ids_dtype=torch.int64):
    (e, top_k, h, inter), w13, w2, seed, x = case(name, t, "pe", mode, route)
    weights, ids = routing(t, top_k, e, seed, ids_dtype=ids_dtype, one_expert=3 if route == "one" else None)
    cfgs = configs_for(mode, w13, w2, t, top_k)
    hk, yk = run_stages(*cfgs, x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written"
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), h)          # gate|up + silu * up
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), inter)    # down + top-k sum
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)
    assert torch.equal(y, yk)  # deterministic: the in-bucket order and the arrival order do not matter
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(y, ref, inter, chained=2)


@pytest.mark.parametrize("mode", ["heuristic", "m8_split3", "m16_split2"])
@pytest.mark.parametrize("t", [1, 3, 16, 64, 256])
@pytest.mark.parametrize("name", list(SHAPES))
def test_matches_reference(name, t, mode):
    check_layer(name, t, mode, ids_dtype=torch.int32 if t == 3 else torch.int64)


@pytest.mark.parametrize("mode", ["m8_split3", "m16"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_one_expert_with_many_pairs_takes_several_passes(name, mode):
    """Every token's slot 0 on expert 3: 64 pairs there, 8 or 4 passes of one item's CTA."""
    check_layer(name, 64, mode, route="one")


def drop_pairs(weights, ids, e, seed):
    """About a third of the pairs -1 with NaN weights, token 1 (when there are 2+) wholly -1, pair
    (0, 0) on expert E and (when there are 3+ tokens) one pair far outside (2**40, or 2**30 for int32
    ids): ``(weights, ids, valid)``, valid marking the pairs that contribute."""
    t, top_k = ids.shape
    away = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed + 1)).cuda() < 0.35
    if t >= 2:
        away[1] = True
    bad = ids.masked_fill(away, -1)
    bad[0, 0] = e
    if t >= 3:
        bad[2, top_k - 1] = 2**40 if bad.dtype == torch.int64 else 2**30
    return weights.masked_fill(bad == -1, float("nan")), bad, (bad >= 0) & (bad < e)


@pytest.mark.parametrize("mode", ["heuristic", "m8_split3", "m16_split2"])
@pytest.mark.parametrize("t", [1, 3, 16, 64, 256])
@pytest.mark.parametrize("name", list(SHAPES))
def test_minus_one_and_ids_outside_contribute_nothing(name, t, mode):
    """About a third of the pairs -1 with NaN weights (never read), one id E and one far outside (the
    grouped path reads nothing on the host: they contribute nothing too), and one token (when there
    are 2+) wholly -1: h rows of dropped pairs are zero, that token's y row is zero, the rest matches
    the reference with the dropped pairs' weights zeroed."""
    (e, top_k, h, inter), w13, w2, seed, x = case(name, t, "pe-ep", mode)
    weights, bad, valid = drop_pairs(*routing(t, top_k, e, seed), e, seed)
    cfgs = configs_for(mode, w13, w2, t, top_k)
    hk, yk = run_stages(*cfgs, x, w13.packed, w2.packed, weights, bad)
    hv = hk.view(t, top_k, -1)
    assert (hv[~valid] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    assert_elementwise(hv[valid], ref_h(x, w13.kernel, kept_ids, top_k).view(t, top_k, -1)[valid], h)
    assert not torch.isnan(yk).any()
    if t >= 2:
        assert (yk[1] == 0).all()
    assert_elementwise(yk, ref_y(hk, w2.kernel, kept_ids, kept_weights), inter)
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, kept_weights, kept_ids)
    assert_elementwise(moe_grouped(x, w13.packed, w2.packed, weights, bad, configs=cfgs), ref, inter, chained=2)
    # A whole batch on other ranks: zero output.
    nan = torch.full_like(weights, float("nan"))
    hk, yk = run_stages(*cfgs, x, w13.packed, w2.packed, nan, torch.full_like(bad, -1))
    assert (hk == 0).all() and (yk == 0).all()


@pytest.mark.parametrize("t", [1, 16, 64])
@pytest.mark.parametrize("name", list(SHAPES))
def test_moe_picks_persistent_mode_and_captures_new_routing(name, t):
    """``moe`` (its plan forced to persistent mode) captured once; each replay finds new
    routing, weights and x in the captured tensors -- random, every slot 0 on one expert, a third of
    the pairs -1 with NaN weights, all -1 -- sorted again on the device; the counters the last
    arrivals reset serve the next replay."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    x = torch.randn(t, h, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of("pe-graph", name, t, 0))
    s13, s2 = (c.schedule for c in configs_for("heuristic", w13, w2, t, top_k))
    with forced_schedules(f"moe_gemv:{s13}", f"moe_gemv:{s2}"):
        _capture_and_replay(name, t, x, w13, w2, weights, ids)


def _capture_and_replay(name, t, x, w13, w2, weights, ids):
    e, top_k, h, inter = SHAPES[name]
    plan = grouped_plan(x, w13.packed, w2.packed, top_k)
    assert isinstance(plan, GroupedPlan) and all(c.persistent for c in plan.configs), plan
    graph, out = capture_moe(x, w13.packed, w2.packed, weights, ids)
    for round_ in range(1, 6):
        new_w, new_ids = routing(t, top_k, e, seed_of("pe-graph", name, t, round_),
                                 one_expert=5 if round_ == 2 else None)
        if round_ >= 4:
            new_w, new_ids = drop_share(new_w, new_ids, 0.35 if round_ == 4 else 1.0, round_)
        new_x = torch.randn(t, h, device="cuda").half()
        eager = replay_with(graph, out, (x, weights, ids), (new_x, new_w, new_ids),
                            lambda: mg.moe(x, w13.packed, w2.packed, weights, ids))
        assert torch.equal(out, eager)  # the same kernels outside the graph
        check_dropped(out, x, w13, w2, weights, ids, inter)
