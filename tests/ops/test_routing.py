"""Routing alignment (mixed_gemm.ops.routing) against a Python loop: every pair once, in its
expert's padded run, in token order; empty experts, one expert taking every pair, no tokens; the
argument rules; ids of -1 (an expert on another rank) in no block; no host sync (it captures into a
CUDA graph where a GPU is present)."""
from __future__ import annotations

import pytest
import torch

from mixed_gemm.ops.routing import align_tokens


def loop_alignment(ids: torch.Tensor, experts: int, block: int):
    flat = ids.reshape(-1).tolist()
    pairs = len(flat)
    rows, owners = [], []
    for e in range(experts):
        mine = [i for i, x in enumerate(flat) if x == e]
        if not mine:
            continue
        padded = -(-len(mine) // block) * block
        rows += mine + [pairs] * (padded - len(mine))
        owners += [e] * (padded // block)
    return rows, owners


def check(ids, experts, block):
    r = align_tokens(ids, experts, block)
    rows, owners = loop_alignment(ids, experts, block)
    pairs = ids.numel()
    size = pairs + experts * (block - 1)
    assert r.sorted_ids.dtype == torch.int32 and r.sorted_ids.shape == (size,)
    assert r.block_experts.shape == (-(-size // block),) and r.used.tolist() == [len(rows)]
    assert r.sorted_ids[: len(rows)].tolist() == rows
    assert (r.sorted_ids[len(rows):] == pairs).all()
    assert r.block_experts[: len(owners)].tolist() == owners
    assert (r.block_experts[len(owners):] == -1).all()


@pytest.mark.parametrize("tokens, top_k, experts, block", [(1, 1, 4, 16), (7, 2, 8, 4), (33, 8, 128, 16),
                                                           (300, 6, 64, 64), (5, 2, 3, 1)])
def test_matches_a_loop_on_random_routing(tokens, top_k, experts, block):
    gen = torch.Generator().manual_seed(tokens * 1000 + experts)
    scores = torch.rand(tokens, experts, generator=gen)
    check(scores.topk(top_k, dim=1).indices, experts, block)


def test_edge_cases():
    check(torch.zeros(0, 2, dtype=torch.long), 8, 16)              # no tokens
    check(torch.full((50, 1), 3, dtype=torch.int32), 8, 16)        # every pair on one expert
    check(torch.tensor([[7, 0]] * 9), 8, 4)                         # experts 1..6 get nothing
    check(torch.arange(16).reshape(8, 2) % 5, 5, 3)


def test_minus_one_is_routed_to_no_expert():
    """-1 marks a pair whose expert lives on another rank: in no block, never a row (the loop skips
    it too); a whole batch of -1 uses no block."""
    ids = torch.tensor([[2, -1], [-1, -1], [0, 2], [-1, 1]])
    check(ids, 4, 2)
    r = align_tokens(ids, 4, 2)
    assert not set(r.sorted_ids[: r.used.item()].tolist()) & {1, 2, 3, 6}
    check(torch.full((6, 2), -1), 4, 8)
    assert align_tokens(torch.full((6, 2), -1), 4, 8).used.item() == 0


@pytest.mark.parametrize("args, exc, msg", [
    ((torch.tensor([[0, 9]]), 8, 16), ValueError, r"topk_ids: expert ids must lie in \[0, 8\)"),
    ((torch.tensor([[-2, 0]]), 8, 16), ValueError, r"\[0, 8\) \(num_experts\) or be -1 .* got -2"),
    ((torch.tensor([0, 1]), 8, 16), ValueError, "topk_ids: expected an integer .tokens, top_k. tensor"),
    ((torch.rand(2, 2), 8, 16), ValueError, "topk_ids: expected an integer"),
    (([[0]], 8, 16), TypeError, "topk_ids: expected a torch.Tensor"),
    ((torch.tensor([[0]]), 0, 16), ValueError, "num_experts: expected a positive int"),
    ((torch.tensor([[0]]), 8, 0), ValueError, "block: expected a positive int"),
])
def test_bad_arguments_name_the_rule(args, exc, msg):
    with pytest.raises(exc, match=msg):
        align_tokens(*args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_and_captures_into_a_graph():
    gen = torch.Generator(device="cuda").manual_seed(7)
    ids = torch.rand(64, 128, device="cuda", generator=gen).topk(8, dim=1).indices
    want = align_tokens(ids.cpu(), 128, 16)
    got = align_tokens(ids, 128, 16)
    assert torch.equal(got.sorted_ids.cpu(), want.sorted_ids) and torch.equal(got.block_experts.cpu(), want.block_experts)
    static = ids.clone()
    align_tokens(static, 128, 16)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = align_tokens(static, 128, 16)
    static.copy_(torch.rand(64, 128, device="cuda", generator=gen).topk(8, dim=1).indices)
    graph.replay()
    again = align_tokens(static.cpu(), 128, 16)
    assert torch.equal(captured.sorted_ids.cpu(), again.sorted_ids) and torch.equal(captured.used.cpu(), again.used)
    # -1 (another rank's expert) in the replayed routing: in no block, as on the CPU
    static[::3, 1:4] = -1
    graph.replay()
    again = align_tokens(static.cpu(), 128, 16)
    assert torch.equal(captured.sorted_ids.cpu(), again.sorted_ids) and torch.equal(captured.used.cpu(), again.used)
    assert torch.equal(captured.block_experts.cpu(), again.block_experts)
