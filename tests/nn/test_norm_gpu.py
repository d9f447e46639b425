"""OneKernelRMSNorm on the GPU: torch's fused rms_norm against the float32 reference, one launch,
under CUDA-graph replay and torch.compile."""
import pytest
import torch

from mixed_gemm.nn import OneKernelRMSNorm

pytestmark = pytest.mark.gpu


def reference(weight, eps, x):
    xf = x.float()
    return weight.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 2048), (512, 2048), (3, 7, 128)])
def test_matches_reference(dtype, shape):
    torch.manual_seed(0)
    norm = OneKernelRMSNorm(torch.randn(shape[-1], device="cuda", dtype=dtype), 1e-6)
    x = torch.randn(shape, device="cuda", dtype=dtype) * 4
    out = norm(x)
    tol = 8e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(out.float(), reference(norm.weight, 1e-6, x), rtol=tol, atol=tol)


def test_graph_replay_and_compile_see_new_inputs():
    torch.manual_seed(1)
    norm = OneKernelRMSNorm(torch.randn(256, device="cuda", dtype=torch.float16), 1e-5)
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        norm(x)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = norm(x)
    for seed in (2, 3):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))  # poisoned: the replay must write every element
        graph.replay()
        torch.testing.assert_close(out.float(), reference(norm.weight, 1e-5, x), rtol=8e-3, atol=8e-3)
    compiled = torch.compile(norm, fullgraph=True)
    y = torch.randn(5, 256, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(compiled(y).float(), reference(norm.weight, 1e-5, y), rtol=8e-3, atol=8e-3)
