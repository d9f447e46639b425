"""The per-expert path of ``moe`` (and of the dense baseline): one call per expert that got tokens."""
from __future__ import annotations

import torch


def per_expert(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, counts, expert) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * expert(e, x rows routed to e)`` accumulated in float32, one
    ``expert(e, rows)`` call per expert with pairs (``counts[e]`` of them, read on the host): the
    per-expert loop of transformers' eager experts, for ``moe`` on a GPU and the dense baseline."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        pairs = order[start:start + c]
        start += c
        tokens = pairs // topk_ids.shape[1]
        y = expert(e, x.index_select(0, tokens))
        out.index_add_(0, tokens, y.float() * topk_weights.reshape(-1).index_select(0, pairs).float().unsqueeze(1))
    return out.to(x.dtype)
