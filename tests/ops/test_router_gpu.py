"""The router kernel on the GPU: every catalog config against the float32 reference (logits
element-wise; the selection exact for the logits it returns; scores from those probabilities),
ragged token tiles, the arrival counters left at zero, CUDA-graph replays with new inputs, and
``torch.compile(fullgraph=True)`` of TopKRouter."""
import pytest
import torch

from mixed_gemm.kernels.router import FAMILY, MAX_STAGED, MAX_TOKENS, RouterProblem, catalog
from mixed_gemm.nn import TopKRouter
from mixed_gemm.ops import topk_router
from mixed_gemm.ops.router import _dtype_name, launch_router, router_reference
from tolerance import _EPS, assert_elementwise

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def inputs(tokens, experts, hidden, xdt, wdt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(xdt)
    w = (torch.randn(experts, hidden, device="cuda", generator=g) / hidden ** 0.5).to(wdt)
    return x, w


def poison(*shapes_dtypes):
    """Fill blocks of the outputs' sizes with NaN / -7 and free them: the caching allocator hands
    the same blocks to the call's outputs, so anything it fails to write shows."""
    for shape, dtype in shapes_dtypes:
        torch.empty(shape, dtype=dtype, device="cuda").fill_(float("nan") if dtype.is_floating_point else -7)


def check(x, w, top_k, logits, scores, ids, renormalize, scale):
    ref = x.float() @ w.float().T
    assert_elementwise(logits, ref, k=x.shape[1])
    probs = torch.softmax(logits.float(), -1)
    top = torch.topk(probs, top_k, -1).values
    picked = probs.gather(-1, ids)
    assert torch.equal(picked, top), "not the top-k of the returned logits (or not in descending order)"
    assert all(len(set(r)) == top_k for r in ids.tolist()) and ids.min() >= 0 and ids.max() < w.shape[0]
    want = picked / picked.sum(-1, keepdim=True) if renormalize else picked
    torch.testing.assert_close(scores.float(), want * scale, rtol=4 * _EPS[scores.dtype] + 1e-6, atol=1e-7)


@pytest.mark.parametrize("config", catalog(), ids=lambda c: c.kernel_name)
def test_every_config(config):
    launcher = FAMILY.launcher(config, 0)
    counters = torch.zeros(256, dtype=torch.int32, device="cuda")
    # whole and partial rounds of the unrolled loads, within what a multi-token tile may stage
    hidden = min(1024 * config.split + 8 * (config.split - 1), MAX_STAGED // (2 * config.tokens) // 8 * 8)
    for i, (experts, top_k, tokens) in enumerate([(8, 2, 1), (128, 8, config.tokens), (256, 8, 2 * config.tokens + 1),
                                                  (60, 6, 3)]):
        x, w = inputs(tokens, experts, hidden, DT[config.x], DT[config.w], seed=i)
        prob = RouterProblem(tokens, experts, hidden, top_k, config.x, config.w, config.logits, config.scores)
        assert FAMILY.can_implement(config, prob)[0]
        poison(((tokens, experts), DT[config.logits]), ((tokens, top_k), DT[config.scores]),
               ((tokens, top_k), torch.int64))
        renorm, scale = i % 2 == 0, (1.0, 2.5)[i % 2]
        out = launch_router(launcher, x, w, top_k, renorm, scale, DT[config.logits], DT[config.scores], counters)
        torch.cuda.synchronize()
        check(x, w, top_k, *out, renorm, scale)
        assert not counters.any(), "the last CTA of every tile resets its counter"


@pytest.mark.parametrize("tokens", [1, 2, 5, 16, 100, MAX_TOKENS, MAX_TOKENS + 1])
def test_op_chooses_and_falls_back(tokens):
    x, w = inputs(tokens, 128, 2048, torch.float16, torch.float16, seed=tokens)
    logits, scores, ids = topk_router(x, w, 8, renormalize=True)
    if tokens > MAX_TOKENS:  # torch ops: exactly the reference
        for a, b in zip((logits, scores, ids), router_reference(x, w, 8, renormalize=True)):
            assert torch.equal(a, b)
    else:
        check(x, w, 8, logits, scores, ids, True, 1.0)


def test_cuda_graph_replays_new_inputs():
    x, w = inputs(4, 128, 2048, torch.bfloat16, torch.float32, seed=3)
    run = lambda: topk_router(x, w, 6, renormalize=False, scale=1.5, logits_dtype=torch.float32)  # noqa: E731
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (4, 5, 6):
        x.copy_(inputs(4, 128, 2048, torch.bfloat16, torch.float32, seed=seed)[0])
        graph.replay()
        graph.replay()  # twice: counters back at zero after each replay
        torch.cuda.synchronize()
        check(x, w, 6, *out, False, 1.5)
        eager = run()
        for a, b in zip(out, eager):
            assert torch.equal(a, b)


def test_compiled_module_matches_eager():
    _, w = inputs(1, 64, 2048, torch.float16, torch.float16, seed=7)
    router = TopKRouter(torch.nn.Parameter(w, requires_grad=False), 6, renormalize=True,
                        scores_dtype=torch.float32).cuda()
    compiled = torch.compile(router, fullgraph=True)
    for tokens in (1, 9):
        x = inputs(tokens, 64, 2048, torch.float16, torch.float16, seed=tokens)[0].view(1, tokens, 2048)
        for a, b in zip(compiled(x), router(x)):
            assert torch.equal(a, b)
    assert _dtype_name(torch.float16) == "f16"
