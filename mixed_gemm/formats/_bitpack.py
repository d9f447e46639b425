"""Bit-exact packing of small unsigned integers into int32 words (vectorized, CPU and CUDA).

A word holds ``P = 32 // bits`` fields; field ``i`` occupies bits ``[bits*i, bits*(i+1))`` of the
word's two's-complement pattern, so the last field includes the int32 sign bit.  An optional
``order`` says which element goes where: field ``i`` holds element ``order[i]`` of its group of ``P``
consecutive elements (``order=None`` is the identity, i.e. least-significant field first).

No step relies on signed-overflow behaviour: packing splits the word into the low ``P - 1`` fields
(their sum is < 2**(32 - bits), so it never overflows) plus the top field re-read as a signed value
in ``[-2**(bits-1), 2**(bits-1))`` times ``2**(32 - bits)``, which is exactly the int32 value of the
word.  Unpacking uses ``(word >> shift) & mask``, which is right for both arithmetic and logical
shifts.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


def _inverse(order: Sequence[int]) -> list[int]:
    inv = [0] * len(order)
    for i, j in enumerate(order):
        inv[j] = i
    return inv


def pack_last(values: torch.Tensor, bits: int, order: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Pack the last dim of ``values`` (integers in ``[0, 2**bits)``, length a multiple of ``P``).

    Returns an int32 tensor of shape ``(..., M // P)``; word ``j`` holds elements ``P*j .. P*j+P-1``.
    """
    p = 32 // bits
    *lead, m = values.shape
    fields = values.to(torch.int32).reshape(*lead, m // p, p)
    if order is not None:
        fields = fields[..., list(order)]
    low_w = torch.tensor([1 << (bits * i) for i in range(p - 1)], dtype=torch.int32, device=values.device)
    low = (fields[..., : p - 1] * low_w).sum(dim=-1, dtype=torch.int32)
    top = fields[..., p - 1]
    top_signed = top - ((top >> (bits - 1)) << bits)  # [0, 2**bits) -> [-2**(bits-1), 2**(bits-1))
    return (low + top_signed * (1 << (bits * (p - 1)))).contiguous()


def unpack_last(words: torch.Tensor, bits: int, order: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Inverse of :func:`pack_last`: int32 ``(..., W)`` -> uint8 ``(..., W * P)``."""
    p = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    fields = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    if order is not None:
        fields = fields[..., _inverse(order)]
    *lead, w = words.shape
    return fields.to(torch.uint8).reshape(*lead, w * p)
