"""``torch.ops.mixed_gemm.matmul`` (and ``.silu_mul_matmul``, ``.moe``, ``.topk_router``): the ops as torch custom ops, for
torch.compile and export.

The op takes a :class:`PackedWeight`'s tensors and fields instead of the object (ops see tensors
and scalars only), rebuilds the weight view (no copy) and calls :func:`matmul`. Its fake
implementation gives the output's shape and dtype without running anything, so Dynamo traces a
model through it with ``fullgraph=True``. Selection is cached per weight signature (kind, shape,
layout, device), not per weight object, so a compiled call is still a dict lookup.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .experts import PackedExperts
from .gated import silu_mul_matmul
from .matmul import matmul
from .moe import moe
from .packed import PackedWeight
from .router import topk_router


def packed_view(b, scales, zeros, perm, n: int, k: int, bits: int, group_size: int, zero_mode: str,
                layout: str = "sm80", aux: Sequence[torch.Tensor] = ()) -> PackedWeight:
    """A PackedWeight over existing tensors (no copy)."""
    return PackedWeight(b=b, scales=scales, zeros=zeros, n=n, k=k, bits=bits, group_size=group_size,
                        zero_mode=zero_mode, perm=perm, layout=layout, aux=tuple(aux))


@torch.library.custom_op("mixed_gemm::matmul", mutates_args=())
def matmul_op(x: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
              perm: Optional[torch.Tensor], bias: Optional[torch.Tensor], n: int, k: int, bits: int,
              group_size: int, zero_mode: str, layout: str, aux: List[torch.Tensor],
              residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``y = x @ dequant(W).T + bias + residual`` for the PackedWeight with these tensors and fields
    (``aux``: the second layout's tensors, empty for one layout)."""
    w = packed_view(b, scales, zeros, perm, n, k, bits, group_size, zero_mode, layout, aux)
    if not x.is_contiguous():  # compiled graphs may hand over views
        x = x.contiguous()
    if residual is not None and not residual.is_contiguous():
        residual = residual.contiguous()
    return matmul(x, w, bias=bias, residual=residual)


@matmul_op.register_fake
def _matmul_fake(x, b, scales, zeros, perm, bias, n, k, bits, group_size, zero_mode, layout, aux, residual=None):
    torch._check(x.shape[-1] == k, lambda: f"x: last dimension must equal the weight's K={k}")
    return x.new_empty((*x.shape[:-1], n))


def matmul_packed_op(x: torch.Tensor, w: PackedWeight, bias: Optional[torch.Tensor] = None,
                     residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Call the custom op for ``w``."""
    return torch.ops.mixed_gemm.matmul(x, w.b, w.scales, w.zeros, w.perm, bias, w.n, w.k, w.bits, w.group_size,
                                       w.zero_mode, w.layout, list(w.aux), residual)


@torch.library.custom_op("mixed_gemm::silu_mul_matmul", mutates_args=())
def silu_mul_matmul_op(x: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                       perm: Optional[torch.Tensor], n: int, k: int, bits: int, group_size: int, zero_mode: str,
                       layout: str, aux: List[torch.Tensor]) -> torch.Tensor:
    """:func:`mixed_gemm.ops.gated.silu_mul_matmul` for the gate|up PackedWeight with these tensors
    and fields: ``(..., K)`` -> ``(..., N/2)``."""
    w = packed_view(b, scales, zeros, perm, n, k, bits, group_size, zero_mode, layout, aux)
    return silu_mul_matmul(x if x.is_contiguous() else x.contiguous(), w)


@silu_mul_matmul_op.register_fake
def _silu_mul_matmul_fake(x, b, scales, zeros, perm, n, k, bits, group_size, zero_mode, layout, aux):
    torch._check(x.shape[-1] == k, lambda: f"x: last dimension must equal the weight's K={k}")
    return x.new_empty((*x.shape[:-1], n // 2))


@torch.library.custom_op("mixed_gemm::moe", mutates_args=())
def moe_op(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
           w13_b: torch.Tensor, w13_scales: torch.Tensor, w13_zeros: Optional[torch.Tensor],
           w2_b: torch.Tensor, w2_scales: torch.Tensor, w2_zeros: Optional[torch.Tensor],
           inter: int, hidden: int, bits: int, group13: int, group2: int, zero_mode: str, layout: str) -> torch.Tensor:
    """:func:`mixed_gemm.moe` over :class:`PackedExperts` tensors and fields (``w13``: ``(2I, H)``
    per expert with group ``group13``; ``w2``: ``(H, I)`` with ``group2``)."""
    w13 = PackedExperts(w13_b, w13_scales, w13_zeros, 2 * inter, hidden, bits, group13, zero_mode, layout, gate_up=True)
    w2 = PackedExperts(w2_b, w2_scales, w2_zeros, hidden, inter, bits, group2, zero_mode, layout)
    return moe(x if x.is_contiguous() else x.contiguous(), w13, w2, topk_weights, topk_ids)


@moe_op.register_fake
def _moe_fake(x, topk_weights, topk_ids, w13_b, w13_scales, w13_zeros, w2_b, w2_scales, w2_zeros, inter, hidden,
              bits, group13, group2, zero_mode, layout):
    torch._check(x.shape[-1] == hidden, lambda: f"x: last dimension must equal the experts' H={hidden}")
    return torch.empty_like(x)


def moe_packed_op(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """Call the ``mixed_gemm::moe`` custom op for ``w13``/``w2`` (both of one kind; ``w13`` a gate|up
    stack, which the op's tensors cannot say)."""
    if not w13.gate_up:
        raise ValueError("w13: expected a gate|up stack, prepack_experts(..., gate_up=True), got plain rows")
    return torch.ops.mixed_gemm.moe(x, topk_weights, topk_ids, w13.b, w13.scales, w13.zeros, w2.b, w2.scales,
                                    w2.zeros, w2.k, w13.k, w13.bits, w13.group_size, w2.group_size, w13.zero_mode,
                                    w13.layout)


@torch.library.custom_op("mixed_gemm::topk_router", mutates_args=())
def topk_router_op(x: torch.Tensor, weight: torch.Tensor, counters: torch.Tensor, top_k: int, renormalize: bool,
                   scale: float, logits_dtype: torch.dtype,
                   scores_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`mixed_gemm.ops.router.topk_router`: ``(logits, scores, ids)``. ``counters`` is left as
    it was found (zero), so the op declares no mutation."""
    return topk_router(x if x.is_contiguous() else x.contiguous(), weight, top_k, renormalize=renormalize,
                       scale=scale, logits_dtype=logits_dtype, scores_dtype=scores_dtype, counters=counters)


@topk_router_op.register_fake
def _topk_router_fake(x, weight, counters, top_k, renormalize, scale, logits_dtype, scores_dtype):
    tokens, experts = x.shape[0], weight.shape[0]
    return (x.new_empty((tokens, experts), dtype=logits_dtype), x.new_empty((tokens, top_k), dtype=scores_dtype),
            x.new_empty((tokens, top_k), dtype=torch.int64))
