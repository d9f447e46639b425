"""Checks shared by the grouped tile families' GPU tests (moe_sm90a, moe_sm80): one layer of a sweep
case, ids out of range (and a whole batch of -1, expert parallelism's mark), no tokens and one
token, and CUDA-graph capture with new routing between replays (-1 pairs among them). Each takes
the two configs (gate|up, down) of the family under test."""
import torch

import mixed_gemm as mg
from mixed_gemm.ops.moe_grouped import _problems, moe_grouped
from test_moe_gemv_gpu import Experts, layer, ref_h, ref_y, routing, run_stages
from tolerance import assert_elementwise
from weights import seed_of


def check_sweep_case(fam, config_class, seed, dtype, torch_dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter,
                     route, ids_dtype=torch.int64):
    """Both stages of ``config_class`` schedules ``s13`` / ``s2`` through their launchers and through
    ``moe_grouped``, against the kernels' own weights (each stage) and the float32 reference (the
    layer); outputs poisoned with NaN first."""
    w13 = Experts(e, 2 * inter, h, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed, gate_up=True)
    w2 = Experts(e, h, inter, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed + 1000)
    zm = w13.packed.zero_mode
    cfg13 = config_class.from_schedule(s13, dtype=dtype, bits=bits, zero_mode=zm)
    cfg2 = config_class.from_schedule(s2, dtype=dtype, bits=bits, zero_mode=zm)
    for cfg, p in zip((cfg13, cfg2), _problems(t, top_k, w13.packed, w2.packed)):
        assert fam.can_implement(cfg, p) == (True, "")
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", torch_dtype)
    weights, ids = routing(t, top_k, e, seed, ids_dtype=ids_dtype, one_expert=3 if route == "one" else None)
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written"
    # h: the GEMM's output is rounded before silu * up (one more rounding than the reference's).
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), h, chained=2)
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), inter)
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=(cfg13, cfg2))
    if getattr(cfg2, "combine", False) and top_k > 2:
        # The combine's fp32 reductions add a token's k slots in any order: the sums may differ in
        # their last bits, so y in its rounding (one unit of the activation dtype's last place).
        torch.testing.assert_close(y.float(), yk.float(), rtol=2 * torch.finfo(y.dtype).eps,
                                   atol=torch.finfo(y.dtype).eps * yk.float().abs().max().item())
    else:
        assert torch.equal(y, yk)  # deterministic; and h handed over in sorted order gives the same rows
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(y, ref, inter, chained=3)


def check_ids_out_of_range(cfgs, w13, w2, tag, ids_dtype=torch.int64):
    """Pairs whose expert id lies outside [0, E) (negative, E, huge) contribute nothing: their h rows
    are 0, a token with no valid slot gets a zero y row, the rest is exact -- each stage against the
    kernels' own weights, and the layer against the float32 reference of the canonical experts (the
    dropped pairs given weight 0), which no unpacking of the stored weights enters."""
    t, top_k, e = 40, 2, w13.packed.num_experts
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of(tag), ids_dtype=ids_dtype)
    bad = ids.clone()
    bad[0, 1], bad[2, 0], bad[3, 1] = -1, e, (2**40 if ids_dtype == torch.int64 else 2**31 - 1)
    bad[4, :] = -7  # a token with no valid slot: y row zero
    hk, yk = run_stages(*cfgs, x, w13.packed, w2.packed, weights, bad)
    valid = (bad >= 0) & (bad < e)
    hv = hk.view(t, top_k, -1)
    assert (hv[~valid] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    assert_elementwise(hv[valid], ref_h(x, w13.kernel, kept_ids, top_k).view(t, top_k, -1)[valid], 256, chained=2)
    assert (yk[4] == 0).all()
    assert_elementwise(yk, ref_y(hk, w2.kernel, kept_ids, kept_weights), 128)
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, kept_weights, kept_ids)
    assert_elementwise(yk, ref, 128, chained=3)
    # Expert parallelism: a whole batch of -1 (every expert on another rank), NaN weights never read.
    away = torch.full_like(bad, -1)
    nan = torch.full_like(weights, float("nan"))
    hk, yk = run_stages(*cfgs, x, w13.packed, w2.packed, nan, away)
    assert (hk == 0).all() and (yk == 0).all()
    assert (moe_grouped(x, w13.packed, w2.packed, nan, away, configs=cfgs) == 0).all()


def check_no_tokens_and_one_token(cfgs, w13, w2, tag):
    """No tokens: no launch, no error, an empty y. One token: most experts get no rows."""
    x = torch.empty(0, 256, device="cuda").half()
    weights, ids = torch.empty(0, 2, device="cuda"), torch.empty(0, 2, dtype=torch.long, device="cuda")
    run_stages(*cfgs, x, w13.packed, w2.packed, weights, ids)
    assert moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs).shape == (0, 256)
    x = torch.randn(1, 256, device="cuda").half()
    weights, ids = routing(1, 2, w13.packed.num_experts, seed_of(tag))
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), 128, chained=3)


def _minus_one(weights, ids, seed, share):
    """About ``share`` of the pairs, and every slot of token 1, marked -1 (an expert on another
    rank) with NaN weights (never read); ``share=1``: the whole batch."""
    away = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)).cuda() < share
    away[1] = True
    return weights.masked_fill(away, float("nan")), ids.masked_fill(away, -1)


def check_graph_capture(cfgs, tag, e=16, seed=9):
    """Captured once, replayed with new routing and new x written into the captured inputs: the
    per-expert row counts change every replay and nothing is read on the host. Replays 4 and 5
    mark pairs -1 (a third of them, then all): they add nothing, against the reference with their
    weights zeroed."""
    w13, w2 = layer(e=e, seed=seed)
    t, top_k = 96, 2
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of(tag, 0))
    with mg.compile.blocking():
        moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)  # warm-up: load, arrays
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=cfgs)
    for i in range(1, 6):
        w_new, ids_new = routing(t, top_k, e, seed_of(tag, i), one_expert=5 if i == 2 else None)
        if i >= 4:
            w_new, ids_new = _minus_one(w_new, ids_new, seed_of(tag, i, "ep"), 0.35 if i == 4 else 1.0)
        x.copy_(torch.randn(t, 256, generator=torch.Generator().manual_seed(i)).half().cuda())
        weights.copy_(w_new)
        ids.copy_(ids_new)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        away = ids == -1
        ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights.masked_fill(away, 0), ids.masked_fill(away, 0))
        assert_elementwise(y, ref, 128, chained=3)
        assert (y[away.all(1)] == 0).all()
