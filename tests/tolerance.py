"""Element-wise tolerance for results against the float32 reference, shared by the GPU tests."""
from __future__ import annotations

import math

import torch

_EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
ELEMENT_SLACK = 16  # rounding steps allowed per element: dequantized terms, fp32 sums, output rounding


def assert_elementwise(y: torch.Tensor, ref: torch.Tensor, k: int) -> None:
    """Every element of ``y`` within ``atol = ELEMENT_SLACK * eps * sqrt(K) * t`` of ``ref``, where
    ``t = rms(ref) / sqrt(K)`` is the size of one product term for random data: a dot product of K
    rounded terms errs like sqrt(K) terms' rounding."""
    ref = ref.float()
    if not ref.numel():
        return
    term = ref.pow(2).mean().sqrt().item() / math.sqrt(k)
    atol = ELEMENT_SLACK * _EPS[y.dtype] * math.sqrt(k) * term + 1e-6
    torch.testing.assert_close(y.float(), ref, rtol=0, atol=atol)
