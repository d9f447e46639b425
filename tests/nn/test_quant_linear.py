"""QuantLinear: construction, state_dict, the CPU reference path, and (GPU) the kernel path, the
custom op (opcheck), torch.compile(fullgraph=True) and CUDA-graph replay."""
import pytest
import torch
from torch import nn

import mixed_gemm as mg
from mixed_gemm.nn import QuantLinear
from tolerance import assert_elementwise

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _gptq_act_order(n=96, k=256, g=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s = ((torch.rand(n, k // g, generator=gen) + 0.5) * 0.01).half()
    z = torch.randint(0, 16, (n, k // g), generator=gen).half()
    g_idx = (torch.arange(k) // g)[torch.randperm(k, generator=gen)].int()
    return q, s, z, g_idx, mg.pack(q, s, z, format="gptq", bits=4, group_size=g, g_idx=g_idx)


def test_from_linear_state_dict_and_repr():
    torch.manual_seed(0)
    lin = nn.Linear(576, 192, bias=True).half()
    ql = QuantLinear.from_linear(lin, bits=4, group_size=128)
    assert "bits=4, group_size=128" in repr(ql) and "format=plain" in repr(ql)
    x = torch.randn(3, 576).half()
    y = ql(x)
    assert y.dtype == torch.float16 and y.shape == (3, 192)
    assert _rel(y, lin.float()(x.float())) < 0.15  # int4 RTN of a random layer
    fresh = QuantLinear(576, 192, bits=4, group_size=128, bias=True)
    fresh.load_state_dict(ql.state_dict())
    assert torch.equal(fresh(x), y)
    with pytest.raises(TypeError, match="linear: expected an nn.Linear"):
        QuantLinear.from_linear(nn.Conv1d(3, 3, 1))


def test_from_checkpoint_act_order_cpu_reference():
    q, s, z, g_idx, (qw, sc, qz) = _gptq_act_order()
    ql = QuantLinear.from_checkpoint(qw, sc, qz, format="gptq", bits=4, group_size=64, g_idx=g_idx)
    want = mg.reference.dequantize(q, s, z, group_size=64, bits=4, g_idx=g_idx)
    assert torch.equal(ql.dense_weight(), want)  # original K order restored
    x = torch.randn(5, 256).half()
    assert torch.allclose(ql(x).float(), (x.float() @ want.T).half().float(), rtol=0, atol=1e-2)


@GPU
@pytest.mark.gpu
def test_cuda_forward_matches_reference_and_moves():
    q, s, z, g_idx, (qw, sc, qz) = _gptq_act_order(seed=2)
    bias = torch.randn(96).half()
    ql = QuantLinear.from_checkpoint(qw, sc, qz, bias, format="gptq", bits=4, group_size=64, g_idx=g_idx)
    x = torch.randn(2, 7, 256).half()
    y_cpu = ql(x)
    ql = ql.cuda()
    y = ql(x.cuda())
    ref = mg.reference.matmul(x.cuda(), q.cuda(), s.cuda(), z.cuda(), group_size=64, bits=4, g_idx=g_idx.cuda(),
                              bias=bias.cuda())
    assert _rel(y, ref) <= 2e-3 and _rel(y.cpu(), y_cpu) <= 2e-3
    assert_elementwise(y, ref, 256)
    # a strided view (what transformers hands the lm_head: hidden_states[:, -1:, :]), like nn.Linear
    view = x.cuda()[:, -1:, :]
    assert not view.is_contiguous()
    assert torch.equal(ql(view), ql(view.contiguous()))


@GPU
@pytest.mark.gpu
def test_custom_op_opcheck():
    w = mg.prepack(*(t.cuda() for t in mg.pack(*mg.quantize(torch.randn(128, 256).half(), group_size=64),
                                                format="awq", group_size=64)), format="awq", group_size=64)
    x = torch.randn(3, 256, device="cuda").half()
    bias = torch.randn(128, device="cuda").half()
    args = (x, w.b, w.scales, w.zeros, w.perm, bias, w.n, w.k, w.bits, w.group_size, w.zero_mode, w.layout,
            list(w.aux))
    torch.library.opcheck(torch.ops.mixed_gemm.matmul.default, args)
    assert torch.equal(torch.ops.mixed_gemm.matmul(*args), mg.matmul(x, w, bias=bias))


class _Block(nn.Module):
    """A decoder MLP made of QuantLinears: residual + SiLU-gated projection."""

    def __init__(self, hidden=576, inter=1536, group=128):
        super().__init__()
        torch.manual_seed(0)
        lin = lambda i, o: QuantLinear.from_linear(nn.Linear(i, o, bias=False).half(), group_size=group)  # noqa: E731
        self.gate, self.up, self.down = lin(hidden, inter), lin(hidden, inter), lin(inter, hidden)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@GPU
@pytest.mark.gpu
def test_compile_fullgraph_and_cuda_graph_decode_step():
    model = _Block().cuda()
    x = torch.randn(1, 1, 576, device="cuda").half()
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    assert _rel(compiled(x), eager) <= 2e-3  # Inductor fuses silu * up in fp32: not bit-equal to eager
    static_x = x.clone()
    for _ in range(2):  # warm up (compile, select) outside the capture
        compiled(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = compiled(static_x)
    for _ in range(3):
        new = torch.randn_like(x)
        static_x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, compiled(new))


@pytest.mark.parametrize("bits", (2, 3, 7))
def test_low_bit_modules_state_dict_round_trip(bits):
    """1-3-bit and 1:2-sparse 7-bit layers hold the lowbit layout; a module built with the same
    arguments loads their state dict and computes the same (CPU reference path)."""
    lin = torch.nn.Linear(256, 96).half()
    if bits == 7:
        q, s, z = mg.sparsify_quantize(lin.weight.detach().float(), group_size=64)
        m = QuantLinear.from_packed(mg.prepack(q, s, z, format="plain", bits=7, group_size=64), lin.bias)
    else:
        m = QuantLinear.from_linear(lin, bits=bits, group_size=64)
    assert m.layout == "lowbit"
    m2 = QuantLinear(256, 96, bits=bits, group_size=64, bias=True, layout="lowbit", zero_mode=m.zero_mode)
    m2.load_state_dict(m.state_dict())
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(bits)).half()
    assert torch.equal(m2(x), m(x))


def test_a_version_one_three_bit_state_dict_is_refused():
    """3-bit layers moved from bit planes to whole 3-bit fields (QuantLinear version 2): an old state
    dict would load silently and compute garbage, so it names the rule; other widths load as before."""
    lin = torch.nn.Linear(128, 32).half()
    for bits in (2, 3):
        m = QuantLinear.from_linear(lin, bits=bits, group_size=64)
        sd = m.state_dict()
        sd._metadata[""]["version"] = 1
        m2 = QuantLinear(128, 32, bits=bits, group_size=64, bias=True, layout="lowbit", zero_mode=m.zero_mode)
        if bits == 3:
            with pytest.raises(ValueError, match="b: this state dict holds 3-bit weights in the lowbit layout's bit planes"):
                m2.load_state_dict(sd)
        else:
            m2.load_state_dict(sd)
