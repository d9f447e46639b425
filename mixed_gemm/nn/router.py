"""``TopKRouter``: a mixture-of-experts router as one launch (:func:`mixed_gemm.ops.topk_router`),
with the interface of transformers' top-k routers: ``forward(hidden_states (..., H)) ->
(router_logits (T, E), scores (T, k), ids (T, k) int64)``. It holds the router's own weight
(shared, not copied) and its arrival counters (a non-persistent buffer: no checkpoint entry).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..kernels.router import COUNTERS
from ..ops import library  # noqa: F401 - registers torch.ops.mixed_gemm.topk_router
from ..ops.router import topk_router


class TopKRouter(nn.Module):
    """``softmax(x W^T)`` in fp32, the ``top_k`` largest, divided by their sum when
    ``renormalize``, times ``scale``. ``fp32_logits``: the logits of the widened ``x`` (DeepSeek's
    router), else rounded to ``x``'s dtype (Qwen, Mixtral). ``scores_dtype``: None for the
    logits' dtype."""

    def __init__(self, weight: nn.Parameter, top_k: int, *, renormalize: bool, scale: float = 1.0,
                 fp32_logits: bool = False, scores_dtype: Optional[torch.dtype] = None):
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f"weight: expected an (experts, hidden) tensor, got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= weight.shape[0]:
            raise ValueError(f"top_k: expected an int in [1, {weight.shape[0]}] (the experts), got {top_k!r}")
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.top_k, self.renormalize, self.scale = top_k, bool(renormalize), float(scale)
        self.fp32_logits, self.scores_dtype = bool(fp32_logits), scores_dtype
        self.num_experts, self.hidden_dim = weight.shape
        self.register_buffer("counters", torch.zeros(COUNTERS, dtype=torch.int32, device=weight.device),
                             persistent=False)

    def forward(self, hidden_states: torch.Tensor):
        x = hidden_states.reshape(-1, self.hidden_dim)
        logits_dtype = torch.float32 if self.fp32_logits else x.dtype
        scores_dtype = logits_dtype if self.scores_dtype is None else self.scores_dtype
        if torch.compiler.is_compiling():  # traced: the registered op (its fake gives the shapes)
            return torch.ops.mixed_gemm.topk_router(x, self.weight, self.counters, self.top_k, self.renormalize,
                                                    self.scale, logits_dtype, scores_dtype)
        # Eager: the function itself. The custom op's dispatch costs ~35 µs of host time a call
        # (measured: 62 µs against ~85 for transformers' ops at one token), which an eager prefill,
        # host-bound, pays 48 times.
        return topk_router(x if x.is_contiguous() else x.contiguous(), self.weight, self.top_k,
                           renormalize=self.renormalize, scale=self.scale, logits_dtype=logits_dtype,
                           scores_dtype=scores_dtype, counters=self.counters)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden_dim}, top_k={self.top_k}, "
                f"renormalize={self.renormalize}, scale={self.scale}, fp32_logits={self.fp32_logits}, "
                f"scores_dtype={self.scores_dtype}")
