"""Element-wise tolerance for results against the float32 reference, shared by the GPU tests."""
from __future__ import annotations

import math

import torch

_EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
ELEMENT_SLACK = 16  # rounding steps allowed per element: dequantized terms, fp32 sums, output rounding


def assert_elementwise(y: torch.Tensor, ref: torch.Tensor, k: int, chained: int = 1) -> None:
    """Every element of ``y`` within ``atol + rtol |ref|`` of ``ref``: ``atol = chained * ELEMENT_SLACK
    * eps * sqrt(K) * t``, where ``t = rms(ref) / sqrt(K)`` is the size of one product term for random
    data (a dot product of K rounded terms errs like sqrt(K) terms' rounding), and ``rtol = 2 eps``
    for the output's own rounding (an element far out in a heavy-tailed output, such as MoE's
    SiLU(gate) * up, rounds by more than that atol). ``chained``: GEMMs in a row, each feeding the
    next a rounded result (MoE's gate|up then down: 2)."""
    ref = ref.float()
    if not ref.numel():
        return
    term = ref.pow(2).mean().sqrt().item() / math.sqrt(k)
    atol = chained * ELEMENT_SLACK * _EPS[y.dtype] * math.sqrt(k) * term + 1e-6
    torch.testing.assert_close(y.float(), ref, rtol=2 * _EPS[y.dtype], atol=atol)
