"""After a rejected call on the GPU: prove the CUDA context is still usable with a correct one."""
from __future__ import annotations

import torch

import mixed_gemm as mg
from tolerance import assert_elementwise

N, K, G = 128, 256, 64


def assert_cuda_usable(seed: int = 0) -> None:
    """Prepack a fresh random weight, multiply it on the GPU (output poisoned first) and compare with
    the float32 reference element-wise; synchronizes, so a sticky launch error surfaces here."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=gen).half().cuda()
    q, s, z = mg.quantize(w, group_size=G)
    x = torch.randn(5, K, generator=gen).half().cuda()
    y = torch.full((5, N), float("nan"), dtype=torch.float16, device="cuda")
    mg.matmul(x, mg.prepack(q, s, z, format="plain", group_size=G), out=y)
    torch.cuda.synchronize()
    assert_elementwise(y, mg.reference.matmul(x, q, s, z, group_size=G), K)
