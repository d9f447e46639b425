"""``topk_router`` on the CPU (torch ops, the definition the kernel follows): against transformers'
own routers' arithmetic written out, its argument rules, and the custom op's fake shapes."""
import pytest
import torch

from mixed_gemm.ops import topk_router
from mixed_gemm.ops.router import router_reference


def case(tokens=5, experts=16, hidden=64, dtype=torch.float16, wdtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = (torch.randn(experts, hidden, generator=g) / hidden ** 0.5).to(wdtype or dtype)
    return x, w


@pytest.mark.parametrize("renormalize, scale", [(True, 1.0), (False, 1.0), (False, 2.5)])
def test_cpu_follows_the_definition(renormalize, scale):
    x, w = case()
    logits, scores, ids = topk_router(x, w, 4, renormalize=renormalize, scale=scale, scores_dtype=torch.float32)
    ref_logits = torch.nn.functional.linear(x, w)
    probs = torch.softmax(ref_logits.float(), -1)
    values, ref_ids = torch.topk(probs, 4, -1)
    if renormalize:
        values = values / values.sum(-1, keepdim=True)
    assert torch.equal(logits, ref_logits) and torch.equal(ids, ref_ids)
    torch.testing.assert_close(scores, values * scale, rtol=0, atol=0)
    assert ids.dtype == torch.int64 and logits.dtype == torch.float16 and scores.dtype == torch.float32


def test_fp32_logits_widen_x_and_weight():
    x, w = case(wdtype=torch.float32)
    logits, scores, _ = topk_router(x, w, 3, renormalize=False, logits_dtype=torch.float32)
    assert logits.dtype == scores.dtype == torch.float32
    assert torch.equal(logits, torch.nn.functional.linear(x.float(), w))


@pytest.mark.parametrize("kwargs, match", [
    (dict(x=torch.zeros(4, 64, dtype=torch.float64)), "x: expected a float16, bfloat16 or float32"),
    (dict(x=torch.zeros(2, 4, 8, dtype=torch.float16)), "x: expected .* \\(tokens, hidden\\) tensor"),
    (dict(weight=torch.zeros(16, 32, dtype=torch.float16)), "weight: expected an \\(experts, 64\\)"),
    (dict(weight=torch.zeros(16, 64, dtype=torch.bfloat16)), "weight: expected .* of torch.float16 or float32"),
    (dict(top_k=0), "top_k: expected an int in \\[1, 16\\]"),
    (dict(top_k=17), "top_k"), (dict(top_k=True), "top_k"),
    (dict(logits_dtype=torch.bfloat16), "logits_dtype: must be x's dtype"),
    (dict(scores_dtype=torch.int32), "scores_dtype"),
    (dict(counters=torch.zeros(3, dtype=torch.int32)), "counters: expected an int32 tensor"),
])
def test_bad_arguments_raise(kwargs, match):
    x, w = case()
    args = dict(x=x, weight=w, top_k=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        topk_router(args.pop("x"), args.pop("weight"), args.pop("top_k"), **args)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="weight: expected a torch.Tensor"):
        topk_router(case()[0], [[1.0]], 1)


def test_custom_op_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(3, 64, dtype=torch.bfloat16), torch.empty(8, 64, dtype=torch.float32)
        c = torch.empty(256, dtype=torch.int32)
        logits, scores, ids = torch.ops.mixed_gemm.topk_router(x, w, c, 2, True, 1.0, torch.float32, torch.bfloat16)
    assert (logits.shape, logits.dtype) == ((3, 8), torch.float32)
    assert (scores.shape, scores.dtype, ids.shape, ids.dtype) == ((3, 2), torch.bfloat16, (3, 2), torch.int64)


def test_reference_defaults_follow_logits():
    x, w = case(dtype=torch.bfloat16)
    logits, scores, _ = router_reference(x, w, 2, renormalize=True)
    assert logits.dtype == scores.dtype == torch.bfloat16


def test_async_jit_serves_torch_ops_until_the_kernel_is_built(monkeypatch):
    """With async JIT a missing kernel is built in the background (once) and calls take torch ops
    meanwhile, caching nothing; the first call after the build takes the kernel."""
    from concurrent.futures import Future

    from mixed_gemm.kernels.router import FAMILY, RouterProblem
    from mixed_gemm.ops import router

    future, submitted, loaded = Future(), [], []
    monkeypatch.setenv("MIXED_GEMM_JIT", "async")
    monkeypatch.setattr(router, "_LAUNCHERS", {})
    monkeypatch.setattr(router, "_BY_PROBLEM", {})
    monkeypatch.setattr(router, "_PENDING", {})
    monkeypatch.setattr(FAMILY, "supports", lambda device: (True, ""))
    monkeypatch.setattr(FAMILY, "ready", lambda config: False)
    monkeypatch.setattr(router.background, "submit", lambda spec: submitted.append(spec.name) or future)
    monkeypatch.setattr(FAMILY, "launcher", lambda config, device: loaded.append(config) or "launcher")
    problem = RouterProblem(1, 128, 2048, 8, "f16", "f16", "f16", "f16")
    assert router._launcher(problem, 0) is None and router._launcher(problem, 0) is None
    assert submitted == ["mg_router_f16_wf16_lf16_sf16_8w_k8_t1"] and not loaded and not router._BY_PROBLEM
    future.set_result("built")
    assert router._launcher(problem, 0) == "launcher" and router._launcher(problem, 0) == "launcher"
    assert len(loaded) == 1 and len(submitted) == 1
