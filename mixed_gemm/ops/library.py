"""``torch.ops.mixed_gemm.matmul``: the matmul as a torch custom op, for torch.compile and export.

The op takes a :class:`PackedWeight`'s tensors and fields instead of the object (ops see tensors
and scalars only), rebuilds the weight view (no copy) and calls :func:`matmul`. Its fake
implementation gives the output's shape and dtype without running anything, so Dynamo traces a
model through it with ``fullgraph=True``. Selection is cached per weight signature (kind, shape,
layout, device), not per weight object, so a compiled call is still a dict lookup.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from .matmul import matmul
from .packed import PackedWeight


def packed_view(b, scales, zeros, perm, n: int, k: int, bits: int, group_size: int, zero_mode: str,
                layout: str = "sm80", aux: Sequence[torch.Tensor] = ()) -> PackedWeight:
    """A PackedWeight over existing tensors (no copy)."""
    return PackedWeight(b=b, scales=scales, zeros=zeros, n=n, k=k, bits=bits, group_size=group_size,
                        zero_mode=zero_mode, perm=perm, layout=layout, aux=tuple(aux))


@torch.library.custom_op("mixed_gemm::matmul", mutates_args=())
def matmul_op(x: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
              perm: Optional[torch.Tensor], bias: Optional[torch.Tensor], n: int, k: int, bits: int,
              group_size: int, zero_mode: str, layout: str, aux: List[torch.Tensor]) -> torch.Tensor:
    """``y = x @ dequant(W).T + bias`` for the PackedWeight with these tensors and fields (``aux``:
    the second layout's tensors, empty for one layout)."""
    w = packed_view(b, scales, zeros, perm, n, k, bits, group_size, zero_mode, layout, aux)
    if not x.is_contiguous():  # compiled graphs may hand over views
        x = x.contiguous()
    return matmul(x, w, bias=bias)


@matmul_op.register_fake
def _matmul_fake(x, b, scales, zeros, perm, bias, n, k, bits, group_size, zero_mode, layout, aux):
    torch._check(x.shape[-1] == k, lambda: f"x: last dimension must equal the weight's K={k}")
    return x.new_empty((*x.shape[:-1], n))


def matmul_packed_op(x: torch.Tensor, w: PackedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Call the custom op for ``w``."""
    return torch.ops.mixed_gemm.matmul(x, w.b, w.scales, w.zeros, w.perm, bias, w.n, w.k, w.bits, w.group_size,
                                       w.zero_mode, w.layout, list(w.aux))
