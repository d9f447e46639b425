"""``OneKernelRMSNorm``: transformers' RMSNorm as one ``torch.nn.functional.rms_norm`` launch.

transformers' eager RMSNorm is eight kernels and eight Python-level ops (cast, pow, mean, add,
rsqrt, mul, cast, mul). An eager prefill or decode step of a mixture-of-experts model is bound by
its host thread, and the norms are a third of its launches (Qwen3-MoE: four norms a layer, q and k
norms included): one launch each takes that host time off.

Numerics: statistics in fp32, as transformers computes them; the weight multiplies before the one
rounding to the input's dtype, where transformers rounds the normalized value first, so an output
may differ in its last bit (as Inductor's fused norm does). A weight of another dtype than the
input takes transformers' steps exactly (the result then has the promoted dtype, as there).
"""
from __future__ import annotations

import torch
from torch import nn


class OneKernelRMSNorm(nn.RMSNorm):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, sharing ``weight`` (no copy)
    with the norm it replaces. ``variance_epsilon`` is transformers' name of ``eps``, kept for code
    that reads it (tensor-parallel fusions, tools)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        nn.Module.__init__(self)  # nn.RMSNorm's own __init__ would allocate a weight of its own
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
            raise ValueError(f"weight: expected a 1-D tensor (the normalized size), got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"eps: expected a float >= 0, got {eps!r}")
        self.normalized_shape = tuple(weight.shape)
        self.eps = self.variance_epsilon = float(eps)
        self.elementwise_affine = True
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if x.dtype == weight.dtype:
            return torch.nn.functional.rms_norm(x, self.normalized_shape, weight, self.eps)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"
