"""Stacked experts (mixed_gemm.ops.experts): the layout contract (expert e is prepack's weight for
its matrix), the moe layer element-wise against the float32 reference on fresh inputs, every
rule named before anything runs; on a GPU the per-expert path and its refusal under capture (the
grouped path, which captures, is tests/ops/test_moe_gemv_gpu.py's)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import mixed_gemm as mg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerance import assert_elementwise  # noqa: E402

E, H, I = 4, 128, 64


def experts(n, k, *, bits=4, group=32, symmetric=False, dtype=torch.float16, device="cpu", seed=0, layout="auto",
            gate_up=False, e=E):
    """Random experts' canonical (q, s, z) and their stack (gate_up=True: moe's w13)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=gen) / k**0.5
    parts = [mg.quantize(w[i], bits=bits, group_size=group, symmetric=symmetric) for i in range(e)]
    q, s = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    z = None if symmetric else torch.stack([p[2] for p in parts])
    return (q, s, z), mg.prepack_experts(q.to(device), s.to(device), None if z is None else z.to(device), bits=bits,
                                         group_size=group, dtype=dtype, layout=layout,
                                         gate_up=gate_up)


def dense(canonical, *, dtype, bits=4, group=32) -> torch.Tensor:
    """float32 ``(E, N, K)``: each expert dequantized by the reference from its canonical ``(q, s, z)``
    (scales rounded to the stored ``dtype``, as prepack keeps them), gate rows then up rows. Built
    without the library's unpacking, so a packing bug that unpacking mirrors cannot cancel out."""
    q, s, z = canonical
    return torch.stack([mg.reference.dequantize(q[e], s[e].to(dtype), None if z is None else z[e], group_size=group,
                                                bits=bits) for e in range(q.shape[0])])


def routing(t, k, seed, device="cpu", e=E):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(t, e, generator=gen).topk(k, dim=1).indices
    weights = torch.rand(t, k, generator=gen)
    return weights.to(device), ids.to(device)


def on_other_ranks(weights, ids, seed, rows=(1,), share=0.35):
    """Expert parallelism's routing: about ``share`` of the pairs (at least the first token's last
    slot), and every slot of the tokens ``rows``, marked -1 (an expert on another rank), their
    weights NaN (which nothing may read). ``share=0``: none."""
    away = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) < share
    if share == 0:
        return weights, ids
    away[0, -1] = True
    for r in rows:
        if r < ids.shape[0]:
            away[r] = True
    away = away.to(ids.device)
    return weights.masked_fill(away, float("nan")), ids.masked_fill(away, -1)


def dropped(weights, ids, num_experts=E):
    """The routing the float32 reference gets for pairs that contribute nothing (-1, and on the
    grouped path any id outside [0, E)): expert 0 at weight 0."""
    away = (ids < 0) | (ids >= num_experts)
    return weights.masked_fill(away, 0.0), ids.masked_fill(away, 0)


@pytest.mark.parametrize("bits, group, symmetric", [(4, 32, False), (4, 64, True), (8, -1, False), (4, 128, False)])
def test_each_expert_is_prepacks_weight(bits, group, symmetric):
    (q, s, z), w = experts(2 * I, H, bits=bits, group=group, symmetric=symmetric, gate_up=False)
    assert (w.num_experts, w.n, w.k) == (E, 2 * I, H) and not w.gate_up
    for e in range(E):
        one = mg.prepack(q[e], s[e], None if z is None else z[e], format="plain", bits=bits, group_size=group)
        got = w.expert(e)
        assert torch.equal(got.b, one.b) and torch.equal(got.scales, one.scales)
        assert (got.zeros is None) == (one.zeros is None) and (got.zeros is None or torch.equal(got.zeros, one.zeros))
        assert got.b.data_ptr() == w.b.data_ptr() + e * one.b.numel() * one.b.element_size()  # a view at stride


@pytest.mark.parametrize("symmetric", [False, True])
def test_gate_up_stack_interleaves_rows_in_blocks_of_8(symmetric):
    """A gate|up stack stores gate rows 8j..8j+7 then up rows 8j..8j+7 (ops.experts' contract):
    expert e is prepack's weight of those rows; unpack_expert and dequantize give gate then up."""
    (q, s, z), w = experts(2 * I, H, symmetric=symmetric, gate_up=True)
    assert w.gate_up
    stored = torch.cat([torch.cat([torch.arange(8 * j, 8 * j + 8), I + torch.arange(8 * j, 8 * j + 8)])
                        for j in range(I // 8)])
    for e in range(E):
        one = mg.prepack(q[e][stored], s[e][stored], None if z is None else z[e][stored], format="plain", bits=4,
                         group_size=32)
        assert torch.equal(w.expert(e).b, one.b) and torch.equal(w.expert(e).scales, one.scales)
        qe, se, ze = w.unpack_expert(e)
        assert torch.equal(qe, q[e]) and torch.equal(se, s[e].to(se.dtype))
    plain = experts(2 * I, H, symmetric=symmetric, gate_up=False)[1]
    assert torch.equal(w.dequantize(), plain.dequantize())
    h = torch.randn(3, 2 * I)
    gate, up = mg.ops.experts.split_gate_up(h[:, stored])  # a product with the stored rows
    assert torch.equal(gate.reshape(3, I), h[:, :I]) and torch.equal(up.reshape(3, I), h[:, I:])


@pytest.mark.parametrize("t, k", [(1, 1), (5, 2), (33, 2)])
def test_moe_matches_reference_cpu(t, k):
    c13, w13 = experts(2 * I, H, seed=1, gate_up=True)
    c2, w2 = experts(H, I, seed=2)
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(t)).half()
    weights, ids = routing(t, k, seed=t)
    y = torch.full((t, H), float("nan"), dtype=torch.float16)
    y.copy_(mg.moe(x, w13, w2, weights, ids))
    ref = mg.reference.moe(x.float(), dense(c13, dtype=torch.float16), dense(c2, dtype=torch.float16), weights, ids)
    assert_elementwise(y, ref, I, chained=2)


def test_rules_are_named_before_anything_runs():
    _, w13 = experts(2 * I, H, gate_up=True)
    _, w2 = experts(H, I)
    x = torch.randn(3, H).half()
    weights, ids = routing(3, 2, seed=0)
    with pytest.raises(ValueError, match=r"topk_ids: expert ids must lie in \[0, 4\)"):
        mg.moe(x, w13, w2, weights, torch.full_like(ids, 4))
    with pytest.raises(ValueError, match="w13: expected K = H = 64"):
        mg.moe(x[:, :64].contiguous(), w13, w2, weights, ids)
    with pytest.raises(ValueError, match=r"w2: expected \(E, H, I\)"):
        mg.moe(x, w13, experts(H, 2 * I, gate_up=False)[1], weights, ids)
    with pytest.raises(ValueError, match=r"w13: expected a gate\|up stack, prepack_experts\(\.\.\., gate_up=True\)"):
        mg.moe(x, experts(2 * I, H, gate_up=False)[1], w2, weights, ids)
    with pytest.raises(ValueError, match="w2: the down projection is stacked with plain rows"):
        mg.moe(x, w13, w13, weights, ids)
    with pytest.raises(ValueError, match=r"q: a gate\|up stack \(gate_up=True\) has 2I rows with I a multiple of 8"):
        experts(2 * 12, H, gate_up=True)
    with pytest.raises(TypeError, match="x: dtype must equal"):
        mg.moe(x.float(), w13, w2, weights, ids)
    with pytest.raises(ValueError, match="topk_ids, topk_weights: expected equal"):
        mg.moe(x, w13, w2, weights[:, :1], ids)
    with pytest.raises(TypeError, match="topk_ids: expected int32 or int64"):
        mg.moe(x, w13, w2, weights, ids.float())
    with pytest.raises(TypeError, match="w13, w2: expected PackedExperts"):
        mg.moe(x, w13.expert(0), w2, weights, ids)
    with pytest.raises(ValueError, match="layout: experts hold one layout"):
        mg.prepack_experts(*experts(2 * I, H, gate_up=True)[0], group_size=32, layout="sm80+sm90a")


@pytest.mark.parametrize("t, k", [(1, 2), (5, 2), (33, 3)])
def test_minus_one_contributes_nothing_cpu(t, k):
    """-1 (an expert on another rank): the pair adds nothing and its weight is never read; a token
    whose slots are all -1 gets a zero row. Against the reference of the canonical experts with
    those pairs' weights zeroed; the reference's own -1 rule agrees."""
    c13, w13 = experts(2 * I, H, seed=1, gate_up=True)
    c2, w2 = experts(H, I, seed=2)
    d13, d2 = dense(c13, dtype=torch.float16), dense(c2, dtype=torch.float16)
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(t)).half()
    weights, ids = on_other_ranks(*routing(t, k, seed=t), seed=t)
    assert (ids == -1).any()
    y = torch.full((t, H), float("nan"), dtype=torch.float16)
    y.copy_(mg.moe(x, w13, w2, weights, ids.int()))
    ref = mg.reference.moe(x.float(), d13, d2, *dropped(weights, ids))
    assert_elementwise(y, ref, I, chained=2)
    assert (y[(ids == -1).all(1)] == 0).all()
    # (not bitwise: the zeroed pairs change the row counts of expert 0's float32 products)
    torch.testing.assert_close(mg.reference.moe(x.float(), d13, d2, weights, ids), ref, rtol=1e-5, atol=1e-6)


def test_a_batch_all_on_other_ranks_is_zero_cpu():
    _, w13 = experts(2 * I, H, gate_up=True)
    _, w2 = experts(H, I)
    x = torch.randn(7, H).half()
    y = mg.moe(x, w13, w2, torch.full((7, 2), float("nan")), torch.full((7, 2), -1))
    assert y.shape == (7, H) and y.dtype == torch.float16 and (y == 0).all()


@pytest.mark.parametrize("bad", [E, E + 7, -2, -(2**40)])
def test_ids_outside_the_rule_raise_cpu(bad):
    _, w13 = experts(2 * I, H, gate_up=True)
    _, w2 = experts(H, I)
    x = torch.randn(3, H).half()
    weights, ids = routing(3, 2, seed=0)
    ids[1, 0] = bad
    with pytest.raises(ValueError, match=rf"topk_ids: expert ids must lie in \[0, {E}\) \(E\) or be -1 .*got {bad}"):
        mg.moe(x, w13, w2, weights, ids)
    with pytest.raises(ValueError, match=rf"topk_ids: expert ids must lie in \[0, {E}\) \(E\) or be -1"):
        mg.reference.moe(x.float(), w13.dequantize(), w2.dequantize(), weights, ids)


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# A layer every grouped family takes (moe_sm90a reads groups of 64 and up; moe_gemv I % 16 == 0).
GE, GH, GI, GK, GG = 8, 256, 128, 2, 64


def gpu_layer(dtype=torch.float16, layout="auto", seed=11):
    """``(w13, w2, dense w13, dense w2)`` on the GPU: the stacks and the reference's float32 experts
    from the canonical codes."""
    c13, w13 = experts(2 * GI, GH, e=GE, group=GG, seed=seed, dtype=dtype, device="cuda", layout=layout,
                       gate_up=True)
    c2, w2 = experts(GH, GI, e=GE, group=GG, seed=seed + 1, dtype=dtype, device="cuda", layout=layout)
    return w13, w2, dense(c13, dtype=dtype, group=GG).cuda(), dense(c2, dtype=dtype, group=GG).cuda()


def gpu_ep_inputs(t, seed, dtype=torch.float16, share=0.35):
    x = torch.randn(t, GH, generator=torch.Generator().manual_seed(seed)).to("cuda", dtype)
    weights, ids = on_other_ranks(*routing(t, GK, seed, device="cuda", e=GE), seed=seed, share=share)
    return x, weights, ids


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t, k", [(1, 2), (16, 2), (300, 2)])
def test_moe_gpu_matches_reference(dtype, t, k):
    c13, w13 = experts(2 * I, H, seed=3, dtype=dtype, device="cuda", gate_up=True)
    c2, w2 = experts(H, I, seed=4, dtype=dtype, device="cuda")
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(t)).to("cuda", dtype)
    weights, ids = routing(t, k, seed=t, device="cuda")
    y = torch.full((t, H), float("nan"), dtype=dtype, device="cuda")
    y.copy_(mg.moe(x, w13, w2, weights, ids))
    ref = mg.reference.moe(x.float(), dense(c13, dtype=dtype).cuda(), dense(c2, dtype=dtype).cuda(), weights, ids)
    assert_elementwise(y, ref, I, chained=2)


@GPU
@pytest.mark.gpu
def test_moe_gpu_refuses_capture_with_a_reason():
    # sm80-layout experts: no grouped kernel reads them, so only the per-expert path could run
    _, w13 = experts(2 * I, H, device="cuda", layout="sm80", gate_up=True)
    _, w2 = experts(H, I, device="cuda", layout="sm80")
    x = torch.randn(2, H, device="cuda").half()
    weights, ids = routing(2, 2, seed=0, device="cuda")
    mg.moe(x, w13, w2, weights, ids)  # warm: kernels selected and loaded outside the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graph cannot capture.*'sm90a' weight layout"):
        with torch.cuda.graph(graph):
            mg.moe(x, w13, w2, weights, ids)


def test_custom_op_opcheck_and_compile():
    """torch.ops.mixed_gemm.moe: schema, fake implementation and dispatch (opcheck), on the CPU."""
    from mixed_gemm.ops import moe_packed_op

    _, w13 = experts(2 * I, H, seed=5, gate_up=True)
    _, w2 = experts(H, I, seed=6)
    x = torch.randn(6, H).half()
    weights, ids = routing(6, 2, seed=6)
    args = (x, weights, ids, w13.b, w13.scales, w13.zeros, w2.b, w2.scales, w2.zeros, I, H, 4, 32, 32,
            w13.zero_mode, w13.layout)
    torch.library.opcheck(torch.ops.mixed_gemm.moe.default, args)
    assert torch.equal(moe_packed_op(x, w13, w2, weights, ids), mg.moe(x, w13, w2, weights, ids))


def test_no_tokens():
    _, w13 = experts(2 * I, H, gate_up=True)
    _, w2 = experts(H, I)
    y = mg.moe(torch.empty(0, H).half(), w13, w2, torch.empty(0, 2), torch.empty(0, 2, dtype=torch.long))
    assert y.shape == (0, H) and y.dtype == torch.float16


def test_auto_layout_follows_the_grouped_families(monkeypatch):
    """``prepack_experts(layout="auto")`` packs for the grouped kernels wherever one runs: sm90a on the
    H100 (moe_sm90a) and on Ampere (moe_gemv's mma.sync kernels read it too), prepack's own choice
    where none runs (older GPUs) and on the CPU."""
    from mixed_gemm.kernels import base
    from mixed_gemm.ops.experts import experts_layout

    assert experts_layout(torch.device("cpu")) == "auto"
    for capability, layout in (((9, 0), "sm90a"), ((8, 0), "sm90a"), ((8, 9), "sm90a"), ((7, 5), "auto")):
        monkeypatch.setattr(base, "compute_capability", lambda i, c=capability: c)
        assert experts_layout(torch.device("cuda", 0)) == layout, capability


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256, 600])
@pytest.mark.parametrize("forced", [False, True])
def test_minus_one_contributes_nothing_gpu(t, forced):
    """Every GPU path with -1 pairs (NaN weights) and a token of only -1 slots: mg.moe (grouped while
    it pays: moe_gemv's pair mode at 1 token, its expert mode at 16, a tile family at 256 where one
    runs; the per-expert path at 600) and moe_grouped forcing the grouped kernels at every size."""
    from mixed_gemm.ops.moe_grouped import moe_grouped

    w13, w2, d13, d2 = gpu_layer()
    x, weights, ids = gpu_ep_inputs(t, seed=t)
    y = torch.full((t, GH), float("nan"), dtype=torch.float16, device="cuda")
    with mg.compile.blocking():
        y.copy_((moe_grouped if forced else mg.moe)(x, w13, w2, weights, ids))
    ref = mg.reference.moe(x.float(), d13, d2, *dropped(weights, ids, GE))
    assert_elementwise(y, ref, GI, chained=3)
    assert (y[(ids == -1).all(1)] == 0).all()


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256, 600])
@pytest.mark.parametrize("forced", [False, True])
def test_a_batch_all_on_other_ranks_is_zero_gpu(t, forced):
    from mixed_gemm.ops.moe_grouped import moe_grouped

    w13, w2, _, _ = gpu_layer()
    x = torch.randn(t, GH, device="cuda").half()
    weights = torch.full((t, GK), float("nan"), device="cuda")
    ids = torch.full((t, GK), -1, dtype=torch.int32, device="cuda")
    with mg.compile.blocking():
        y = (moe_grouped if forced else mg.moe)(x, w13, w2, weights, ids)
    assert y.shape == (t, GH) and (y == 0).all()


@GPU
@pytest.mark.gpu
def test_per_expert_path_reads_the_routing_and_raises_gpu():
    """sm80-layout experts run the per-expert path, which reads the routing on the host: -1 adds
    nothing; other ids outside [0, E) and NaN weights of routed pairs raise, naming the argument."""
    w13, w2, d13, d2 = gpu_layer(layout="sm80")
    x, weights, ids = gpu_ep_inputs(9, seed=3)
    y = mg.moe(x, w13, w2, weights, ids)
    assert_elementwise(y, mg.reference.moe(x.float(), d13, d2, *dropped(weights, ids, GE)), GI, chained=3)
    for bad in (GE, -2):
        wrong = ids.clone()
        wrong[2, 1] = bad
        with pytest.raises(ValueError, match=rf"topk_ids: expert ids must lie in \[0, {GE}\) .*got {bad}"):
            mg.moe(x, w13, w2, weights, wrong)
    nan = weights.clone()
    nan[ids != -1] = float("nan")
    with pytest.raises(ValueError, match="topk_weights: expected finite weights for the routed pairs"):
        mg.moe(x, w13, w2, nan, ids)


@GPU
@pytest.mark.gpu
def test_grouped_path_drops_ids_outside_the_experts_gpu():
    """The grouped path reads no id on the host: an id >= E or < -1 contributes nothing there (the
    moe docstring's rule), never read out of bounds."""
    w13, w2, d13, d2 = gpu_layer()
    x, weights, ids = gpu_ep_inputs(16, seed=5)
    ids[0, 0], ids[3, 1], ids[4, 0], ids[4, 1] = GE, 2**40, -5, GE + 1
    with mg.compile.blocking():
        y = mg.moe(x, w13, w2, weights, ids)
    assert (y[4] == 0).all()
    assert_elementwise(y, mg.reference.moe(x.float(), d13, d2, *dropped(weights, ids, GE)), GI, chained=3)


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256])
def test_graph_capture_with_minus_one_gpu(t):
    """mg.moe captured once (the grouped path), replayed with routing written into the captured
    inputs: -1 pairs, tokens of only -1, a whole batch of -1, then plain routing again; each replay
    against the reference (the -1 pairs' weights zeroed)."""
    w13, w2, d13, d2 = gpu_layer()
    x, weights, ids = gpu_ep_inputs(t, seed=100 + t)
    with mg.compile.blocking():
        mg.moe(x, w13, w2, weights, ids)  # warm-up: plan, kernels, launch arrays
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mg.moe(x, w13, w2, weights, ids)
    for round_, share in enumerate((0.35, 0.8, 1.0, 0.0)):
        new_x, new_w, new_ids = gpu_ep_inputs(t, seed=200 + 10 * t + round_, share=share)
        x.copy_(new_x)
        weights.copy_(new_w)
        ids.copy_(new_ids)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_elementwise(y, mg.reference.moe(x.float(), d13, d2, *dropped(weights, ids, GE)), GI, chained=3)
        assert (y[(ids == -1).all(1)] == 0).all()
