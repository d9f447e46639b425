"""moe_gemv's one-shot mode (``_m1_os``: gate|up and down in one cooperative launch of at most one CTA
per SM, each CTA's share of both projections' weights copied at its start, a grid barrier between
them) on the GPU: outputs poisoned with NaN first, against the float32 reference of the canonical
(q, s, z) codes, on the small Qwen3-30B-A3B-like and DeepSeek-V2-Lite-like experts of the persistent
tests and a wider layer, at 1-8 tokens (8 tokens: eight gate|up units a CTA, past the deepest
cp.async wait the kernel names); both warp counts; fp16 and bf16, int4 and int8, group 64 and per
channel, gate|up rows interleaved or not, 16-bit top-k weights and int32 ids; -1 ids and ids >= E
contribute nothing (NaN weights never read); the barrier's counters are back at zero after every
launch; CUDA-graph capture with new routing between replays; a share that does not fit is refused
before any launch; no tokens."""
import importlib

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels.moe_gemv import MoeGemvConfig
from mixed_gemm.ops.moe_grouped import forced_schedules
from mixed_gemm.runtime import current_stream
from test_moe_gemv_gpu import (Experts, capture_moe, check_dropped, drop_share, poisoned_outputs_and_launchers,
                               replay_with, routing)
from test_moe_gemv_persistent_gpu import drop_pairs
from tolerance import assert_elementwise
from weights import seed_of

ws = importlib.import_module("mixed_gemm.runtime.workspace")  # the package exports a function of that name
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# name -> (experts, top_k, H, I)
SHAPES = {"qwen3": (128, 8, 512, 256), "deepseek": (64, 6, 512, 384), "wide": (32, 8, 1024, 768)}
WARPS = (8, 16)
_LAYERS = {}


def layer(name, dtype="f16", bits=4, group=128, gate_up=True):
    key = (name, dtype, bits, group, gate_up)
    if key not in _LAYERS:
        e, _, h, inter = SHAPES[name]
        seed = seed_of("os-layer", *key)
        w13 = Experts(e, 2 * inter, h, dtype=dtype, bits=bits, zero="int", group=group, seed=seed, gate_up=gate_up)
        w2 = Experts(e, h, inter, dtype=dtype, bits=bits, zero="int", group=group, seed=seed + 1000)
        _LAYERS[key] = (w13, w2)
    return _LAYERS[key]


def configs(warps, dtype="f16", bits=4):
    return tuple(MoeGemvConfig.from_schedule(f"{stage}_s1_w{warps}x1_u1_m1_os", dtype=dtype, bits=bits)
                 for stage in ("w13", "w2"))


def run_oneshot(cfg13, cfg2, x, w13, w2, weights, ids):
    """The one launch into NaN-poisoned h and y: (h, y)."""
    t, k = ids.shape
    h, y, gate_up, down = poisoned_outputs_and_launchers(cfg13, cfg2, x, w2, t, k)
    gate_up.launch_layer(down, x, w13, w2, ids.contiguous(), weights.contiguous(), h, y, t, k, current_stream(0))
    torch.cuda.synchronize()
    return h, y


def counters_are_zero():
    buf = ws._BUFFERS.get((0, current_stream(0), "semaphores"))
    return buf is None or not buf.tensor.any().item()


def _x(t, h, seed, dtype=torch.float16):
    return torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", dtype)


# (name, tokens) whose shares fit (the wide layer's three tokens would not: test_refuses_...)
CASES = [(n, t) for n in ("qwen3", "deepseek") for t in (1, 2, 3, 8)] + [("wide", 1), ("wide", 2)]


@pytest.mark.parametrize("warps", WARPS)
@pytest.mark.parametrize("name,t", CASES)
def test_matches_reference(name, t, warps):
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    seed = seed_of("os", name, t, warps)
    x = _x(t, h, seed)
    weights, ids = routing(t, top_k, e, seed, ids_dtype=torch.int32 if t == 3 else torch.int64)
    hk, yk = run_oneshot(*configs(warps), x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written"
    assert counters_are_zero()
    _, again = run_oneshot(*configs(warps), x, w13.packed, w2.packed, weights, ids)
    assert torch.equal(again, yk)  # static work, fixed sum order: deterministic
    assert_elementwise(yk, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), inter, chained=2)


@pytest.mark.parametrize("kind", [("bf16", 4, 128, True), ("f16", 8, 128, True), ("bf16", 8, 64, True),
                                  ("f16", 4, -1, True), ("f16", 4, 64, False)])
@pytest.mark.parametrize("t", [1, 3])
def test_weight_kinds(kind, t):
    """Activation dtype, width, group (-1: per channel) and the gate|up order (False: gate rows, then
    up rows); the router's 16-bit weights read as they are."""
    dtype, bits, group, gate_up = kind
    e, top_k, h, inter = SHAPES["deepseek"]
    w13, w2 = layer("deepseek", dtype, bits, group, gate_up)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    seed = seed_of("os-kind", *kind, t)
    x = _x(t, h, seed, tdtype)
    weights, ids = routing(t, top_k, e, seed, weights_dtype=tdtype)
    _, yk = run_oneshot(*configs(8, dtype, bits), x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(yk).any() and counters_are_zero()
    assert_elementwise(yk, mg.reference.moe(x.float(), w13.dense, w2.dense, weights.float(), ids), inter, chained=2)


@pytest.mark.parametrize("name,t", [c for c in CASES if c[1] != 2])
def test_minus_one_and_ids_outside_contribute_nothing(name, t):
    """A third of the pairs -1 with NaN weights (never read), one id E and one far outside, token 1
    (from 2 tokens) wholly -1 and so a zero row; a batch of only -1 gives zeros."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    seed = seed_of("os-ep", name, t)
    x = _x(t, h, seed)
    weights, bad, valid = drop_pairs(*routing(t, top_k, e, seed), e, seed)
    _, yk = run_oneshot(*configs(8), x, w13.packed, w2.packed, weights, bad)
    assert not torch.isnan(yk).any() and counters_are_zero()
    if t >= 2:
        assert (yk[1] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    assert_elementwise(yk, mg.reference.moe(x.float(), w13.dense, w2.dense, kept_weights, kept_ids), inter, chained=2)
    nan = torch.full_like(weights, float("nan"))
    _, yk = run_oneshot(*configs(8), x, w13.packed, w2.packed, nan, torch.full_like(bad, -1))
    assert (yk == 0).all() and counters_are_zero()


@pytest.mark.parametrize("warps", WARPS)
@pytest.mark.parametrize("name", ["qwen3", "deepseek"])
def test_moe_captures_new_routing(name, warps):
    """``moe`` forced to one-shot mode, captured once (the barrier's counters reset in the kernel: no
    memset node); each replay finds new routing, weights and x -- random, every slot 0 on one expert,
    a third -1 with NaN weights, all -1 -- and matches the eager call and the reference."""
    e, top_k, h, inter = SHAPES[name]
    w13, w2 = layer(name)
    x = torch.randn(1, h, device="cuda").half()
    weights, ids = routing(1, top_k, e, seed_of("os-graph", name, warps))
    s13, s2 = (c.schedule for c in configs(warps))
    with forced_schedules(f"moe_gemv:{s13}", f"moe_gemv:{s2}"):
        graph, out = capture_moe(x, w13.packed, w2.packed, weights, ids)
        for round_ in range(1, 6):
            new_w, new_ids = routing(1, top_k, e, seed_of("os-graph", name, warps, round_),
                                     one_expert=5 if round_ == 2 else None)
            if round_ >= 4:
                new_w, new_ids = drop_share(new_w, new_ids, 0.35 if round_ == 4 else 1.0, round_)
            new_x = torch.randn(1, h, device="cuda").half()
            eager = replay_with(graph, out, (x, weights, ids), (new_x, new_w, new_ids),
                                lambda: mg.moe(x, w13.packed, w2.packed, weights, ids))
            assert torch.equal(out, eager)
            check_dropped(out, x, w13, w2, weights, ids, inter)
        assert counters_are_zero()


def test_refuses_a_share_that_does_not_fit():
    """At 64 tokens the wide layer's share is far past shared memory: ValueError naming tokens, before
    any launch (the poisoned y stays NaN)."""
    e, top_k, h, inter = SHAPES["wide"]
    w13, w2 = layer("wide")
    x = _x(64, h, 1)
    weights, ids = routing(64, top_k, e, 1)
    with pytest.raises(ValueError, match="tokens: one-shot mode"):
        run_oneshot(*configs(8), x, w13.packed, w2.packed, weights, ids)
    assert counters_are_zero()


def test_no_tokens():
    e, top_k, h, inter = SHAPES["qwen3"]
    w13, w2 = layer("qwen3")
    x = torch.randn(0, h, device="cuda").half()
    weights, ids = routing(0, top_k, e, 0)
    hk, yk = run_oneshot(*configs(8), x, w13.packed, w2.packed, weights, ids)  # no launch at all
    assert hk.shape == (0, inter) and yk.shape == (0, h) and counters_are_zero()
