"""transformers' RMSNorms as one launch each (:class:`~mixed_gemm.nn.OneKernelRMSNorm`): the
modules :func:`fuse_norms` swaps, and the one-kernel norm the residual and tensor-parallel layer
forwards call directly (:func:`rms_norm`).

Only classes whose forward is exactly transformers' Llama RMSNorm (fp32 statistics, then
``weight * normalized.to(dtype)``) are listed; Gemma's ``(1 + weight)`` and OLMoE's norms are not.
A norm with hooks, a forward of its own on the instance or a weight that is not 1-D stays as it is.
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn import OneKernelRMSNorm

# transformers' RMSNorms whose forward is weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), fp32
# statistics (the same source, checked against transformers 5.x in tests/integrations/test_norms.py).
RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen2MoeRMSNorm",
             "Qwen3MoeRMSNorm", "MixtralRMSNorm", "DeepseekV2RMSNorm", "DeepseekV3RMSNorm", "Phi3RMSNorm",
             "GraniteMoeRMSNorm")


def _llama_form(norm: nn.Module) -> bool:
    weight = getattr(norm, "weight", None)
    return (type(norm).__name__ in RMS_NORMS and "forward" not in vars(norm)
            and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and isinstance(getattr(norm, "variance_epsilon", None), float))


def one_kernel_norm(norm: nn.Module) -> bool:
    """Whether ``norm`` computes transformers' RMSNorm, as one of :data:`RMS_NORMS` or as the
    :class:`OneKernelRMSNorm` that replaced one."""
    return isinstance(norm, OneKernelRMSNorm) or _llama_form(norm)


def swappable(norm: nn.Module) -> bool:
    """Whether :func:`fuse_norms` replaces ``norm``: one of :data:`RMS_NORMS`, without hooks."""
    return _llama_form(norm) and not (norm._forward_hooks or norm._forward_pre_hooks)


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` (a norm :func:`one_kernel_norm` accepts) as one ``rms_norm`` launch, without the
    module call; a norm with hooks or a weight of another dtype than ``x`` runs as the module."""
    weight = norm._parameters.get("weight")
    if norm._forward_hooks or norm._forward_pre_hooks or weight is None or weight.dtype != x.dtype:
        return norm(x)
    return torch.nn.functional.rms_norm(x, weight.shape, weight, norm.variance_epsilon)


def fuse_norms(model: nn.Module) -> int:
    """Replace every swappable RMSNorm of ``model`` (module docstring) by a
    :class:`OneKernelRMSNorm` sharing its weight, in place; returns how many changed."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if swappable(child):
                setattr(parent, name, OneKernelRMSNorm(child.weight, child.variance_epsilon))
                swapped += 1
    return swapped
