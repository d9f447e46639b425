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
            gate_up=False):
    """Random experts' canonical (q, s, z) and their stack (gate_up=True: moe's w13)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(E, n, k, generator=gen) / k**0.5
    parts = [mg.quantize(w[e], bits=bits, group_size=group, symmetric=symmetric) for e in range(E)]
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


def routing(t, k, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(t, E, generator=gen).topk(k, dim=1).indices
    weights = torch.rand(t, k, generator=gen)
    return weights.to(device), ids.to(device)


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


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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
