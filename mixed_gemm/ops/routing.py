"""Routing alignment for mixture-of-experts GEMMs: the (token, slot) pairs of a top-k router,
grouped by expert and padded so that every block of ``block`` rows belongs to one expert (what
servers call ``moe_align_block_size``). A grouped kernel then runs one tile per block and reads
its expert's weights once for all of the block's rows.

Everything is computed with sync-free torch ops on the ids' device: the output sizes depend only on
the input's shape (never on how many tokens an expert got), so the step runs under CUDA-graph
capture and ``torch.compile`` without a host sync.

Layout contract (``T`` tokens, ``k`` slots per token, ``E`` experts, ``B = block``):

- ``sorted_ids`` int32 ``(T*k + E*(B - 1),)``: for each expert in order, the flat indices
  ``t*k + j`` of its pairs in increasing order, then padding up to a multiple of ``B``; every
  padding entry and the unused tail hold ``T*k`` (one past the last pair, a kernel's "no row").
- ``block_experts`` int32 ``(len(sorted_ids) // B,)`` rounded up: the expert of each block, or
  ``-1`` for blocks past the used ones (a kernel skips them).
- ``used`` int32 ``(1,)``: the number of used rows of ``sorted_ids`` (a multiple of ``B``).

An expert with no pairs gets no block. A pair whose id is ``-1`` (expert parallelism: its expert
lives on another rank; ``mixed_gemm.moe``'s convention) is routed to no expert: it is in no block,
its row is never computed. Any other id outside ``[0, E)`` raises ``ValueError`` for CPU tensors;
on a GPU that check would cost a host sync, so it runs only with ``check=True`` (debugging);
otherwise such a pair is routed to no expert, like ``-1``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Routing(NamedTuple):
    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    used: torch.Tensor
    block: int


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def align_tokens(topk_ids: torch.Tensor, num_experts: int, block: int, *, check: bool = False) -> Routing:
    """Group the pairs of ``topk_ids`` (integer ``(T, k)``) by expert, each expert's run padded to
    a multiple of ``block``. See the module docstring for the exact layout."""
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"topk_ids: expected a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dim() != 2 or topk_ids.is_floating_point() or topk_ids.is_complex() or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids: expected an integer (tokens, top_k) tensor, got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    num_experts = _positive_int("num_experts", num_experts)
    block = _positive_int("block", block)
    ids = topk_ids.reshape(-1).long()
    pairs = ids.numel()
    if (topk_ids.device.type == "cpu" or check) and pairs:
        bad = (ids < -1) | (ids >= num_experts)
        if bool(bad.any()):
            raise ValueError(f"topk_ids: expert ids must lie in [0, {num_experts}) (num_experts) or be -1 (a pair "
                             f"routed to no expert), got {int(ids[bad][0])}")
    device = ids.device
    # -1 and (unchecked on the GPU) out-of-range ids sort after every expert and land in no block.
    key = torch.where((ids >= 0) & (ids < num_experts), ids, torch.full_like(ids, num_experts))
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device).scatter_add_(
        0, key, torch.ones_like(key))[:num_experts]
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.sort(key, stable=True).indices
    sorted_keys = key[order]
    # Rank of each pair within its expert: its place in the sorted order minus the expert's first place.
    first = torch.cumsum(counts, 0) - counts
    in_range = sorted_keys < num_experts
    safe = sorted_keys.clamp(max=num_experts - 1)
    rank = torch.arange(pairs, device=device) - first[safe]
    size = pairs + num_experts * (block - 1)
    sorted_ids = torch.full((size + 1,), pairs, dtype=torch.int32, device=device)
    dest = torch.where(in_range, starts[safe] + rank, torch.full_like(rank, size))  # the extra slot: dropped
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    sorted_ids = sorted_ids[:size]
    blocks = (size + block - 1) // block
    block_start = torch.arange(blocks, device=device) * block
    expert = torch.searchsorted(ends, block_start, right=True)
    block_experts = torch.where(block_start < ends[-1], expert, torch.full_like(expert, -1)).to(torch.int32)
    return Routing(sorted_ids, block_experts, ends[-1:].to(torch.int32), block)
