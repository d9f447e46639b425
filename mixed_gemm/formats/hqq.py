"""HQQ's packed weights (the ``hqq`` package, ``axis=1``) <-> canonical ``(q, s, z)``.

HQQ quantizes ``W`` ``(N, K)`` in groups of ``G`` consecutive elements along K: ``W.reshape(-1, G)``
gives ``R = N K / G`` rows (row ``r = n K/G + g`` is group ``g`` of output ``n``), ``W_q`` ``(R, G)``
holds ``q = round(W / s + z)`` and ``meta["scale"]`` / ``meta["zero"]`` ``(R, 1)`` hold ``s`` and a
float zero point ``z`` (``w = (q - z) s``: ``zero_mode="float"``). ``W_q`` is then bit-packed along
its rows (``hqq.core.bitpack.BitPack``), ``P`` values per element, value ``j`` of element ``i``
being row ``i + j R/P`` (the first rows in the highest bits)::

    bits  packing   storage                   element [i, c] (step = rows of the packed tensor)
    8     8bit_u8   uint8 (R, G)              q[i]
    4     4bit_u8   uint8 (R/2, G)            q[i] << 4 | q[i + step]
    2     2bit_u8   uint8 (R/4, G)            q[i] << 6 | q[i + step] << 4 | ... | q[i + 3 step]
    1     1bit_u8   uint8 (R/8, G)            q[i] << 7 | ... | q[i + 7 step]
    3     3bit_32   int32 (ceil(R/10), G)     q[i] << 27 | q[i + step] << 24 | ... | q[i + 9 step]
                                              (R padded with zero rows to a multiple of 10)

``W_q`` saved with HQQ's ``view_as_float`` (its bytes viewed as a float tensor) is viewed back.
HQQ stores no N and K, so :func:`unpack` takes ``shape=(N, K)`` (HQQ's ``meta["shape"]``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

# bits -> (values per stored element, storage dtype)
PACKING = {8: (1, torch.uint8), 4: (2, torch.uint8), 2: (4, torch.uint8), 1: (8, torch.uint8), 3: (10, torch.int32)}


def packing_name(bits: int) -> str:
    """hqq's name of the packing (its ``meta["packing"]``)."""
    return "3bit_32" if bits == 3 else f"{bits}bit_u8"


def _shifts(bits: int):
    per, _ = PACKING[bits]
    width = 30 if bits == 3 else 8  # 3-bit: ten values in the low 30 bits of an int32
    return [width - bits * (j + 1) for j in range(per)]


def unpack_rows(w_q: torch.Tensor, bits: int, rows: int) -> torch.Tensor:
    """HQQ's packed ``W_q`` -> uint8 ``(rows, G)`` codes."""
    per, storage = PACKING[bits]
    if w_q.dtype != storage and w_q.is_floating_point():
        w_q = w_q.view(storage)  # saved with view_as_float
    if w_q.dtype != storage or w_q.dim() != 2:
        raise ValueError(f"qweight: format 'hqq' {bits}-bit is {storage} (rows, group_size) (its {bits}bit packing), "
                         f"got {w_q.dtype} with shape {tuple(w_q.shape)}")
    step = w_q.shape[0]
    need = -(-rows // per) if bits == 3 else rows // per
    if step != need or (bits != 3 and rows % per):
        raise ValueError(f"qweight: format 'hqq' {bits}-bit packs {per} rows per element: {rows} rows (N*K/group_size) "
                         f"need {need} packed rows{'' if bits == 3 or rows % per == 0 else ' and a multiple of ' + str(per)}, "
                         f"got {step}")
    w = w_q.to(torch.int64) & (0xFFFFFFFF if bits == 3 else 0xFF)
    mask = (1 << bits) - 1
    q = torch.cat([(w >> sh) & mask for sh in _shifts(bits)], dim=0)
    return q[:rows].to(torch.uint8)


def pack_rows(q_rows: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 ``(R, G)`` codes -> HQQ's packed ``W_q`` (exact inverse of :func:`unpack_rows`)."""
    per, storage = PACKING[bits]
    rows = q_rows.shape[0]
    if bits != 3 and rows % per:
        raise ValueError(f"q: format 'hqq' {bits}-bit packs {per} rows of (N*K/group_size, group_size) per byte: "
                         f"N*K/group_size must be a multiple of {per}, got {rows}")
    padded = -(-rows // per) * per
    v = torch.zeros((padded, q_rows.shape[1]), dtype=torch.int64, device=q_rows.device)
    v[:rows] = q_rows.to(torch.int64)
    step = padded // per
    out = torch.zeros((step, q_rows.shape[1]), dtype=torch.int64, device=q_rows.device)
    for j, sh in enumerate(_shifts(bits)):
        out |= v[j * step:(j + 1) * step] << sh
    if storage == torch.int32:
        return out.to(torch.int32)
    return out.to(torch.uint8)


def check_shape(shape, group_size: int) -> Tuple[int, int]:
    if shape is None:
        raise ValueError("shape: format 'hqq' needs the weight's (N, K) (HQQ's meta['shape']): its tensors do not hold them")
    n, k = (int(d) for d in shape)
    if group_size == -1:
        group_size = k
    if n <= 0 or k <= 0 or k % group_size:
        raise ValueError(f"shape: format 'hqq' groups {group_size} consecutive elements along K; K must be a "
                         f"positive multiple of group_size, got shape {(n, k)}")
    return n, k


def unpack(w_q: torch.Tensor, scale: torch.Tensor, zero: Optional[torch.Tensor], bits: int, group_size: int, shape):
    """HQQ's ``(W_q, meta['scale'], meta['zero'])`` -> canonical ``(q, s, z)`` (``z`` float zero points)."""
    n, k = check_shape(shape, group_size)
    g = k if group_size == -1 else group_size
    rows = n * k // g
    if w_q.shape[-1] != g and not w_q.is_floating_point():
        raise ValueError(f"qweight: format 'hqq' is (rows, group_size={g}), got shape {tuple(w_q.shape)}")
    q = unpack_rows(w_q, bits, rows).reshape(n, k)
    for name, t in (("scales", scale), ("zeros", zero)):
        if t is None:
            raise ValueError(f"{name}: format 'hqq' stores a scale and a zero point per group (meta['scale'], meta['zero'])")
        if t.numel() != rows:
            raise ValueError(f"{name}: format 'hqq' holds one value per group, N*K/group_size = {rows}, "
                             f"got shape {tuple(t.shape)}")
    return q.contiguous(), scale.reshape(n, k // g).contiguous(), zero.reshape(n, k // g).to(scale.dtype).contiguous()


def pack(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], bits: int):
    """Canonical ``(q, s, z)`` -> HQQ's ``(W_q, scale (R, 1), zero (R, 1))``."""
    if z is None:
        raise ValueError("z: format 'hqq' stores a zero point per group (it has no symmetric form)")
    n, k = q.shape
    g = k // s.shape[1]
    rows = n * k // g
    return pack_rows(q.reshape(rows, g), bits), s.reshape(rows, 1).contiguous(), z.reshape(rows, 1).contiguous()
