"""nn.TopKRouter on the CPU: its argument rules, eager calls going to the function (not the custom
op, whose dispatch is host time an eager prefill pays per layer), and a non-contiguous input."""
import pytest
import torch

from mixed_gemm.nn import TopKRouter
from mixed_gemm.nn import router as nn_router
from mixed_gemm.ops.router import router_reference


def weight(experts=16, hidden=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(experts, hidden, generator=g) / hidden ** 0.5).half()


@pytest.mark.parametrize("w, top_k, match", [
    (torch.zeros(16), 2, "weight: expected an .experts, hidden. tensor"),
    (weight(), 0, r"top_k: expected an int in \[1, 16\]"),
    (weight(), 17, r"top_k: expected an int in \[1, 16\]"),
    (weight(), True, r"top_k: expected an int"),
])
def test_bad_arguments_raise(w, top_k, match):
    with pytest.raises(ValueError, match=match):
        TopKRouter(w, top_k, renormalize=True)


def test_eager_forward_calls_the_function(monkeypatch):
    calls = []
    real = nn_router.topk_router

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(nn_router, "topk_router", spy)
    r = TopKRouter(weight(), 4, renormalize=True, scores_dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, generator=g).half()
    logits, scores, ids = r(x)
    assert len(calls) == 1 and calls[0]["counters"] is r.counters
    ref = router_reference(x.reshape(-1, 64), r.weight, 4, renormalize=True, scores_dtype=torch.float32)
    assert torch.equal(logits, ref[0]) and torch.equal(scores, ref[1]) and torch.equal(ids, ref[2])


def test_non_contiguous_input():
    r = TopKRouter(weight(), 2, renormalize=False, scale=2.0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 6, generator=g).half().t()  # (6, 64), not contiguous
    logits, scores, ids = r(x)
    ref = router_reference(x.contiguous(), r.weight, 2, renormalize=False, scale=2.0)
    assert torch.equal(logits, ref[0]) and torch.equal(scores, ref[1]) and torch.equal(ids, ref[2])
