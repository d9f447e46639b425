"""1:2-sparse 7-bit weights (gemlite's "sparse/7-bit", seed 004): half the weights are zero in a
fixed pattern, the other half carry 7-bit codes, at int4's 4 bits per weight.

Canonical form: an ordinary 7-bit ``(q, s, z)`` whose pairs along K (``(n, 2i)``, ``(n, 2i + 1)``)
have at least one element at its group's zero code (``q == z``, or ``2**6`` when symmetric): that
element's weight is exactly ``(z - z) s = 0``, so every other part of mixed_gemm (the reference
included) reads the weight exactly, zeros and all. :func:`sparsify_quantize` makes one.

Checkpoint form ``format="sparse12"``: ``qweight`` uint8 ``(N, K / 2)``, one byte per pair, the
kept element's 7-bit code in bits 0-6 and its position in bit 7 (1: the first of the pair, 0: the
second; a pair of two zero codes stores position 1 and the zero code); ``scales`` ``(N, K / G)``
and ``zeros`` (integer zero codes, or None) as in the canonical form. ``G`` must be even (a pair
never straddles groups). Packing a weight with a pair of two non-zero codes is an error.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C
from .quantize import quantize

BITS = 7


def _zero_codes(s: torch.Tensor, z: Optional[torch.Tensor], k: int, g: int) -> torch.Tensor:
    """The zero code of every element ``(N, K)`` (int16)."""
    if z is None:
        return torch.full((s.shape[0], k), 1 << (BITS - 1), dtype=torch.int16, device=s.device)
    return z.to(torch.int16).repeat_interleave(g, dim=1)[:, :k]


def sparsify_quantize(w: torch.Tensor, *, group_size: int = 128, symmetric: bool = False):
    """Keep the larger magnitude of each pair along K (the other becomes 0), then quantize group-wise
    to 7 bits (:func:`mixed_gemm.quantize`): canonical ``(q, s, z)`` in the 1:2 form (module doc).
    ``K`` and ``group_size`` must be even."""
    C.check_tensor("w", w, dtypes=C.SCALE_DTYPES, ndim=2)
    n, k = w.shape
    if k % 2:
        raise ValueError(f"w: 1:2 sparsity pairs elements along K; K must be even, got K={k}")
    if group_size != -1 and group_size % 2:
        raise ValueError(f"group_size: a pair must not straddle groups; expected an even size or -1, got {group_size}")
    pairs = w.reshape(n, k // 2, 2)
    keep_first = pairs[..., 0].abs() >= pairs[..., 1].abs()
    pruned = torch.where(torch.stack((keep_first, ~keep_first), dim=-1), pairs, torch.zeros_like(pairs))
    return quantize(pruned.reshape(n, k), bits=BITS, group_size=group_size, symmetric=symmetric)


def pack(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], g: int) -> torch.Tensor:
    """Canonical 1:2 7-bit ``q`` -> ``qweight`` uint8 ``(N, K / 2)`` (module doc)."""
    n, k = q.shape
    if k % 2 or g % 2:
        raise ValueError(f"q: format 'sparse12' pairs elements along K inside a group: K and group_size must be "
                         f"even, got K={k}, group_size={g}")
    zc = _zero_codes(s, z, k, g).reshape(n, k // 2, 2)
    qp = q.to(torch.int16).reshape(n, k // 2, 2)
    is_zero = qp == zc
    dense = ~(is_zero[..., 0] | is_zero[..., 1])
    if bool(dense.any()):
        row, pair = (int(i) for i in dense.nonzero()[0])
        raise ValueError(f"q: format 'sparse12' needs one zero code ({int(zc[row, pair, 0])}) in every pair along K; "
                         f"row {row}, columns {2 * pair} and {2 * pair + 1} are both non-zero "
                         f"({int(qp[row, pair, 0])}, {int(qp[row, pair, 1])}): use sparsify_quantize")
    first = ~is_zero[..., 0] | is_zero[..., 1]  # the kept element is the first (both zero: first too)
    val = torch.where(first, qp[..., 0], qp[..., 1])
    return (val | (first.to(torch.int16) << 7)).to(torch.uint8).contiguous()


def unpack(qweight: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], g: int) -> torch.Tensor:
    """``qweight`` uint8 ``(N, K / 2)`` -> canonical ``q`` uint8 ``(N, K)`` (the dropped element of
    each pair at its group's zero code)."""
    n, half = qweight.shape
    k = 2 * half
    v = qweight.to(torch.int16)
    val, first = v & 0x7F, (v >> 7).bool()
    zc = _zero_codes(s, z, k, g).reshape(n, half, 2)
    q = torch.stack((torch.where(first, val, zc[..., 0]), torch.where(first, zc[..., 1], val)), dim=-1)
    return q.reshape(n, k).to(torch.uint8).contiguous()
