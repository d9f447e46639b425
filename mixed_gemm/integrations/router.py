"""transformers' top-k routers replaced by :class:`~mixed_gemm.nn.TopKRouter` (one launch where
the router runs four to six kernels: a linear of 1-16 rows, softmax, topk's two passes, the
division, a cast). Each supported class is listed with what its forward computes; any other router,
or one configured otherwise (DeepSeek's group-limited top-k), stays as it was.

- Qwen2-MoE, Qwen3-MoE: logits in the activations' dtype, renormalized when ``norm_topk_prob``,
  scores in the logits' dtype.
- Mixtral: logits in the activations' dtype, always renormalized, fp32 scores.
- DeepSeek-V2 (``topk_method="greedy"``): fp32 logits of the widened activations and fp32 weight,
  never renormalized, times ``routed_scaling_factor``, fp32 scores. transformers asks for unsorted
  top-k there; the kernel's descending order is one of the orders that allows.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
from torch import nn

from ..nn import TopKRouter


def _qwen(r) -> dict:
    return dict(renormalize=bool(r.norm_topk_prob))


def _mixtral(r) -> dict:
    return dict(renormalize=True, scores_dtype=torch.float32)


def _deepseek_v2(r) -> Optional[dict]:
    if getattr(r, "topk_method", "greedy") != "greedy":
        return None  # group-limited top-k: not the kernel's selection
    return dict(renormalize=False, scale=float(r.routed_scaling_factor), fp32_logits=True,
                scores_dtype=torch.float32)


ROUTERS: Dict[str, Callable[[nn.Module], Optional[dict]]] = {
    "Qwen2MoeTopKRouter": _qwen, "Qwen3MoeTopKRouter": _qwen, "MixtralTopKRouter": _mixtral,
    "DeepseekV2TopkRouter": _deepseek_v2,
}


def fused_router(router: nn.Module) -> Optional[TopKRouter]:
    """The :class:`TopKRouter` computing what ``router`` computes, or None for a router that is not
    one of :data:`ROUTERS` (or is configured otherwise), has hooks, or a weight of another shape."""
    spec = ROUTERS.get(type(router).__name__)
    weight = getattr(router, "weight", None)
    if spec is None or router._forward_hooks or router._forward_pre_hooks or not isinstance(weight, torch.Tensor):
        return None
    fields = spec(router)
    if fields is None or weight.dim() != 2 or getattr(router, "top_k", 0) > weight.shape[0]:
        return None
    return TopKRouter(weight, int(router.top_k), **fields)


def fuse_routers(model: nn.Module) -> int:
    """Replace every supported router of ``model`` (a ``gate`` child of a sparse-MoE block) in
    place; returns how many changed."""
    fused = 0
    for module in list(model.modules()):
        gate = getattr(module, "gate", None)
        if isinstance(gate, nn.Module) and not isinstance(gate, TopKRouter):
            new = fused_router(gate)
            if new is not None:
                module.gate = new
                fused += 1
    return fused
