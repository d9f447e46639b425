"""Random quantized weights for timing: one packed weight and cheap copies of it (cold L2); random
MoE routing."""
from __future__ import annotations

from typing import List

import torch

from ..ops import PackedWeight, prepack
from .problems import MoeShape

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def packed_bytes(n: int, k: int, bits: int, group_size: int, zeros: bool = True) -> int:
    """Bytes a checkpoint stores for an (N, K) weight: packed q, fp16 scales, packed integer zeros
    (7 bits: the 1:2-sparse format, a byte per pair)."""
    groups = 1 if group_size in (-1, k) else k // group_size
    qbits = 4 if bits == 7 else bits
    return n * k * qbits // 8 + 2 * n * groups + (n * groups * bits // 8 if zeros else 0)


def random_weights(n: int, k: int, *, bits: int = 4, group_size: int = 128, zero_mode: str = "int",
                   dtype: str = "f16", copies: int = 1, layout: str = "auto") -> List[PackedWeight]:
    """``copies`` PackedWeights with the same random contents in separate memory (``layout`` as
    :func:`mixed_gemm.prepack` takes it: ``"auto"`` packs what the GPU's families read)."""
    gs = k if group_size == -1 else group_size
    groups = -(-k // gs)
    td = TORCH_DTYPES[dtype]
    q = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device="cuda")
    s = ((torch.rand(n, groups, device="cuda") + 0.5) * (2.0 / (2**bits * k**0.5))).to(td)
    z = None
    if zero_mode == "int":
        z = torch.randint(0, 2**bits, (n, groups), device="cuda").to(td)
    if bits == 7:  # 1:2-sparse: one element of every pair along K at its zero code
        zc = (z if z is not None else torch.full_like(s, 64.0)).to(torch.uint8).repeat_interleave(gs, dim=1)[:, :k]
        drop = torch.randint(0, 2, (n, k // 2, 1), device="cuda")
        pairs = q.view(n, k // 2, 2)
        pairs.scatter_(2, drop, zc.reshape(n, k // 2, 2).gather(2, drop))
    elif zero_mode == "float":
        z = (torch.rand(n, groups, device="cuda") * (2**bits - 1)).to(td)
    elif zero_mode == "offset":
        z = (-torch.rand(n, groups, device="cuda") * 2**bits * s.float()).to(td)
    w = prepack(q, s, z, format="plain", bits=bits, group_size=group_size, dtype=td, layout=layout,
                zero_mode="int" if zero_mode == "sym" else zero_mode)
    del q
    out = [w]
    clone = lambda t: None if t is None else t.clone()  # noqa: E731
    for _ in range(copies - 1):
        out.append(PackedWeight(b=w.b.clone(), scales=w.scales.clone(), zeros=clone(w.zeros), n=n, k=k, bits=bits,
                                group_size=w.group_size, zero_mode=w.zero_mode, layout=w.layout,
                                aux=tuple(t.clone() for t in w.aux)))
    return out


def random_routing(tokens: int, shape: MoeShape, gen: torch.Generator, device="cuda"):
    """``(topk_weights, topk_ids)`` of a softmax router over random logits (renormalized top-k)."""
    logits = torch.randn(tokens, shape.experts, generator=gen).to(device)
    weights, ids = torch.softmax(logits, dim=-1).topk(shape.top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids
