"""``silu_mul_matmul`` on the GPU: a fused gate|up weight read as one expert of moe_gemv's gate|up
stage (SiLU·mul in the epilogue) at 1-16 rows, the matmul fallback above, against the float32
reference of the weights as the kernel forms them; CUDA-graph capture with new inputs, and the
custom op under torch.compile (fullgraph)."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.nn import QuantLinear
from mixed_gemm.ops.gated import GATED_MAX_ROWS, _as_expert, gated_kernel, silu_mul_matmul
from test_moe_gemv_gpu import kernel_weights
from test_sm90a_gpu import DTYPES, make_case
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def gate_up_weight(dtype, bits, zero, group, inter, k, seed):
    """A random (2I, K) gate|up weight prepacked on the GPU, and its (2I, K) float32 kernel weights."""
    q, s, z, fmt, zm = make_case(bits, zero, group, 2 * inter, k, seed)
    tdtype = DTYPES[dtype]
    packed = mg.pack(q, s.to(tdtype), None if z is None else z.to(tdtype), format=fmt, bits=bits, group_size=group,
                     zero_mode=zm)
    w = mg.prepack(*(None if t is None else t.cuda() for t in packed), format=fmt, bits=bits, group_size=group,
                   zero_mode=zm, dtype=tdtype)
    experts = _as_expert(w)
    return w, None if experts is None else kernel_weights(experts)[0]


def reference(x, weights):
    inter = weights.shape[0] // 2
    gu = x.double() @ weights.double().t()
    return (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).float()


CASES = [(dtype, bits, zero, group, rows)
         for dtype in ("f16", "bf16") for bits in (4, 8) for zero, group in (("int", 128), ("sym", 64), ("float", 32),
                                                                             ("offset", -1))
         for rows in (1, 3, 8, 16)] + [("f16", 4, "int", 128, 17), ("bf16", 4, "int", 128, 40)]


@pytest.mark.parametrize("dtype,bits,zero,group,rows", CASES)
def test_silu_mul_matmul_matches_the_reference(dtype, bits, zero, group, rows):
    inter, k = (384, 1024) if bits == 4 else (256, 768)
    w, weights = gate_up_weight(dtype, bits, zero, group, inter, k, seed_of(dtype, bits, zero, group, rows))
    assert weights is not None, "the H100's one copy must be readable as one expert"
    grouped = gated_kernel(w, rows)
    assert (grouped is not None) == (rows <= GATED_MAX_ROWS)  # the epilogue path at decode sizes
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to("cuda", DTYPES[dtype])
    h = silu_mul_matmul(x, w)
    assert h.shape == (rows, inter) and h.dtype == x.dtype
    assert_elementwise(h, reference(x, weights), k)


def test_leading_dims_and_graph_replay_with_new_inputs():
    w, weights = gate_up_weight("f16", 4, "int", 128, 512, 2048, 7)
    x = torch.randn(2, 4, 2048, device="cuda").half()
    h = silu_mul_matmul(x, w)
    assert h.shape == (2, 4, 512)
    assert_elementwise(h.reshape(8, 512), reference(x.reshape(8, 2048), weights), 2048)
    static = torch.randn(4, 2048, device="cuda").half()
    silu_mul_matmul(static, w)  # warm: kernel loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = silu_mul_matmul(static, w)
    for seed in (1, 2):
        static.copy_(torch.randn(4, 2048, generator=torch.Generator().manual_seed(seed)).half())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_elementwise(out, reference(static, weights), 2048)


def test_quant_linear_silu_mul_compiled_fullgraph():
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 2 * 256, bias=False).half().cuda()
    q = QuantLinear.from_linear(lin, bits=4, group_size=128)
    x = torch.randn(2, 1024, device="cuda").half()
    want = q.silu_mul(x)
    gate, up = q(x).float().split(256, dim=-1)
    torch.testing.assert_close(want.float(), torch.nn.functional.silu(gate) * up, rtol=2e-2, atol=2e-3)
    got = torch.compile(q.silu_mul, fullgraph=True)(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
