"""moe_gemv's one-launch persistent mode (``_m<8|16>_pe1``: gate|up and down in one kernel, items
from one atomic queue, a down item waiting on its expert's gate|up items) on the GPU, on the
Qwen3-30B-A3B-like and DeepSeek-V2-Lite-like experts of the two-launch persistent tests: outputs
poisoned with NaN first, against the float32 reference of the canonical (q, s, z) codes at 1, 3, 16
and 64 tokens, and bitwise against the two-launch persistent mode of the same tile and splits (the
same sums in the same order); -1 ids and ids >= E contribute nothing; every counter is back at zero
after each launch; CUDA-graph capture with new routing between replays; no tokens."""
import importlib

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels.moe_gemv import MoeGemvConfig
from mixed_gemm.ops.moe_grouped import forced_schedules, moe_grouped
from mixed_gemm.runtime import current_stream
from test_moe_gemv_gpu import poisoned_outputs_and_launchers, routing
from test_moe_gemv_persistent_gpu import SHAPES, _capture_and_replay, drop_pairs, layer
from tolerance import assert_elementwise
from weights import seed_of

ws = importlib.import_module("mixed_gemm.runtime.workspace")  # the package exports a function of that name
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# mode -> (gate|up schedule, down schedule), one launch each
MODES = {
    "m8": ("w13_s1_w4x2_u8_m8_pe1", "w2_s1_w4x2_u8_m8_pe1"),
    "m8_split3": ("w13_s1_w4x2_u8_m8_pe1_split3", "w2_s1_w4x2_u8_m8_pe1_split2"),
    "m16_split2": ("w13_s1_w4x2_u8_m16_pe1_split2", "w2_s1_w4x2_u8_m16_pe1_split3"),
}


def configs(mode, fused=True):
    s13, s2 = MODES[mode]
    if not fused:
        s13, s2 = s13.replace("_pe1", "_pe"), s2.replace("_pe1", "_pe")
    return MoeGemvConfig.from_schedule(s13), MoeGemvConfig.from_schedule(s2)


def run_fused(cfg13, cfg2, x, w13, w2, weights, ids):
    """The one launch into NaN-poisoned h and y: (h, y)."""
    t, k = ids.shape
    stream = current_stream(0)
    h, y, gate_up, down = poisoned_outputs_and_launchers(cfg13, cfg2, x, w2, t, k)
    gate_up.launch_layer(down, x, w13, w2, ids.contiguous(), weights.float().contiguous(), h, y, t, k, stream)
    torch.cuda.synchronize()
    return h, y


def counters_are_zero():
    """The stream's semaphores (queue, per-expert counts, arrival counters) after the launches."""
    buf = ws._BUFFERS.get((0, current_stream(0), "semaphores"))
    return buf is None or not buf.tensor.any().item()


def _x(t, h, seed):
    return torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.float16)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("t", [1, 3, 16, 64])
@pytest.mark.parametrize("name", list(SHAPES))
def test_matches_reference_and_the_two_launch_mode(name, t, mode):
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    seed = seed_of("pe1", name, t, mode)
    x = _x(t, h, seed)
    weights, ids = routing(t, top_k, e, seed, ids_dtype=torch.int32 if t == 3 else torch.int64)
    hk, yk = run_fused(*configs(mode), x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written"
    assert counters_are_zero()
    two = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs(mode, fused=False))
    assert torch.equal(yk, two)  # the same items' sums in the same order: bitwise
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs(mode))
    assert torch.equal(y, yk)  # deterministic: the claim order and the waits do not matter
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(y, ref, inter, chained=2)


@pytest.mark.parametrize("mode", ["m8_split3", "m16_split2"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_one_expert_with_many_pairs(name, mode):
    """Every token's slot 0 on expert 3: 64 pairs there, several passes per item, and the other
    experts' down items start while expert 3's gate|up items still run."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    seed = seed_of("pe1-one", name, mode)
    x = _x(64, h, seed)
    weights, ids = routing(64, top_k, e, seed, one_expert=3)
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs(mode))
    assert counters_are_zero()
    assert torch.equal(y, moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs(mode, fused=False)))
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), inter, chained=2)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("t", [1, 3, 16, 64])
@pytest.mark.parametrize("name", list(SHAPES))
def test_minus_one_and_ids_outside_contribute_nothing(name, t, mode):
    """About a third of the pairs -1 with NaN weights (never read), one id E and one far outside, one
    token (when there are 2+) wholly -1: that token's y row is zero, the rest matches the reference
    with the dropped pairs' weights zeroed; a batch of only -1 gives zeros (no touched expert: no
    item, the queue still reset)."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    seed = seed_of("pe1-ep", name, t, mode)
    x = _x(t, h, seed)
    weights, bad, valid = drop_pairs(*routing(t, top_k, e, seed), e, seed)
    _, yk = run_fused(*configs(mode), x, w13.packed, w2.packed, weights, bad)
    assert not torch.isnan(yk).any() and counters_are_zero()
    if t >= 2:
        assert (yk[1] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, kept_weights, kept_ids)
    assert_elementwise(yk, ref, inter, chained=2)
    nan = torch.full_like(weights, float("nan"))
    _, yk = run_fused(*configs(mode), x, w13.packed, w2.packed, nan, torch.full_like(bad, -1))
    assert (yk == 0).all() and counters_are_zero()


@pytest.mark.parametrize("mode", ["m8_split3", "m16_split2"])
@pytest.mark.parametrize("t", [1, 16, 64])
@pytest.mark.parametrize("name", list(SHAPES))
def test_moe_captures_new_routing(name, t, mode):
    """``moe`` forced to the one-launch mode, captured once (no memset node: the kernel resets its
    queue and counters); each replay finds new routing, weights and x -- random, every slot 0 on one
    expert, a third -1 with NaN weights, all -1 -- and matches the eager call and the reference."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    x = torch.randn(t, h, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of("pe1-graph", name, t, 0))
    s13, s2 = MODES[mode]
    with forced_schedules(f"moe_gemv:{s13}", f"moe_gemv:{s2}"):
        _capture_and_replay(name, t, x, w13, w2, weights, ids)
        assert counters_are_zero()


@pytest.mark.parametrize("name", list(SHAPES))
def test_no_tokens(name):
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    x = torch.randn(0, h, device="cuda").half()
    weights, ids = routing(0, top_k, e, 0)
    cfgs = configs("m8_split3")
    assert moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs).shape == (0, h)
    hk, yk = run_fused(*cfgs, x, w13.packed, w2.packed, weights, ids)  # no launch at all
    assert hk.shape == (0, inter) and yk.shape == (0, h) and counters_are_zero()
