"""The ``sm90a`` weight layout: canonical ``(q, s, z)`` -> the tensors the sm90a (Hopper wgmma)
kernels read. Pure torch, vectorized, CPU or CUDA.

The kernel computes ``y^T = W x^T`` with W as wgmma's register operand A, so W is stored K-major
in 16 x 16 (n, k) **atoms**, each the slice of a ``wgmma.m64nNk16`` A fragment that one warp holds
(the same thread/value ownership as an ``mma.sync.m16n8k16`` A fragment)::

        k ->  0        16       32             K16          b: int32 (K16/16, N_pad/16, 8*bits)
    n   0   +--------+--------+-- ... --+                   atom (nb, kb) = b[kb, nb, :]
    |       | (0,0)  | (0,1)  |         |                   (atoms of one 16-k column are
    v   16  +--------+--------+-- ... --+                    contiguous along n: a TMA box of
            | (1,0)  | (1,1)  |         |                    TM/16 atoms x TK/16 columns)
        32  +--------+--------+-- ... --+

    inside an atom (n = 16 nb + 8 n1 + n0, k = 16 kb + 8 k2 + 2 k1 + k0):
      lane l = 4 n0 + k1 owns one 32-bit word (int4) / 64-bit pair of words (int8);
      int4 nibble  4 k0 + 2 k2 + n1   (value order [0,2,4,6,1,3,5,7] of the fragment's 8 values)
      int8 byte    4 k2 + 2 k0 + n1   (value order [0,2,1,3] per 32-bit half)

i.e. element ``(n, k)`` sits at element offset ``256 (nb + N_pad/16 kb) + 32 n0 + 8 k1 + 4 k0 + 2 k2 + n1``
(int4; int8: ``... + 4 k2 + 2 k0 + n1``), low nibble first. This is CUTLASS's offline "shuffle" for
the mixed-input collective (``compute_memory_reordering_atom`` with that value order): one
32-bit shared-memory load gives a lane its 8 int4 values, and the value order is the one the
collective's lop3/prmt converters take without per-element shifts. ``templates/sm90a`` exports
the CuTe layout (``mg_layout_offset``) and a test compares it with :func:`element_offset`.

Codes are stored signed, ``q' = q - 2**(bits-1)`` (two's complement nibbles / bytes, i.e.
``q ^ 0x8`` / ``q ^ 0x80``): the fast converters are for signed types. The collective's zero is
additive after the scale (``w = q' s + z'``), so every zero mode folds into ``z'`` here, computed
in float32 and rounded once to the activation dtype:

- symmetric (zero point ``2**(bits-1)``): ``z' = 0``;
- integer or float zero points ``z`` (``w = (q - z) s``): ``z' = (2**(bits-1) - z) s``;
- offsets ``m`` (``w = q s + m``): ``z' = 2**(bits-1) s + m``.

``scales`` and ``zeros`` are ``(G, N_pad)`` row-major in the activation dtype ("MN-major", what
the collective's scale TMA reads). ``N`` is padded to ``N_pad`` (multiple of 16) and ``K`` to
``K16`` (multiple of 16) with stored code 0, scale 0 and zero 0; padded rows never reach the
output (the epilogue stores ``N`` rows) and padded columns meet TMA's zero fill of ``x``.

On GPUs where the sm90a family runs this is the one copy prepack makes
(:func:`mixed_gemm.kernels.layout_for`); the gemv (decode) kernels and the sm90a dequantize kernel
read it too. :func:`unpack` recovers the canonical weight: codes and scales exactly, integer zero
points exactly (``z = 2**(bits-1) - z'/s`` rounded: the error of ``z'`` in 16 bits is below a
quarter for ``|2**(bits-1) - z| <= 128``), float zeros and offsets to the precision of ``z'``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..common import round_up

NAME = "sm90a"
ATOM = 16
ALWAYS_ZEROS = True  # the collective is compiled with a zero operand: symmetric weights store 0



def _check(q: torch.Tensor, bits: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"bits: must be 4 or 8, got {bits}")
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise TypeError(f"q: expected a 2-D torch.uint8 tensor, got {q.dtype} with shape {tuple(q.shape)}")


# Dimension order (of q viewed as nb, n1, n0, kb, k2, k1, k0) in storage order, per bit width.
_ORDER = {4: (3, 0, 2, 5, 6, 4, 1), 8: (3, 0, 2, 5, 4, 6, 1)}


def pack_b(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Canonical ``q`` (uint8 ``(N, K)`` in ``[0, 2**bits)``) -> int32 ``(K16/16, N_pad/16, 8*bits)``."""
    _check(q, bits)
    n, k = q.shape
    n_pad, k16 = round_up(n, ATOM), round_up(k, ATOM)
    half = 1 << (bits - 1)
    qp = torch.zeros((n_pad, k16), dtype=torch.uint8, device=q.device)
    qp[:n, :k] = q ^ half  # signed code q - 2**(bits-1), two's complement in `bits` bits
    v = qp.view(n_pad // ATOM, 2, 8, k16 // ATOM, 2, 4, 2).permute(*_ORDER[bits]).reshape(-1)
    if bits == 4:
        v = v[0::2] | (v[1::2] << 4)  # low nibble first
    return v.view(torch.int32).view(k16 // ATOM, n_pad // ATOM, 8 * bits).contiguous()


def unpack_b(b: torch.Tensor, bits: int, n: int, k: int) -> torch.Tensor:
    """Exact inverse of :func:`pack_b`: -> uint8 ``(n, k)``."""
    n_pad, k16 = round_up(n, ATOM), round_up(k, ATOM)
    expect = (k16 // ATOM, n_pad // ATOM, 8 * bits)
    if b.dtype != torch.int32 or tuple(b.shape) != expect:
        raise ValueError(f"b: expected int32 {expect} for n={n}, k={k}, got {b.dtype} {tuple(b.shape)}")
    v = b.contiguous().view(torch.uint8).reshape(-1)
    if bits == 4:
        v = torch.stack((v & 0xF, v >> 4), dim=1).reshape(-1)
    half = 1 << (bits - 1)
    order = _ORDER[bits]
    shape = [(n_pad // ATOM, 2, 8, k16 // ATOM, 2, 4, 2)[d] for d in order]
    inverse = [order.index(d) for d in range(7)]
    q = v.view(*shape).permute(*inverse).reshape(n_pad, k16)
    return (q[:n, :k] ^ half).contiguous()


def element_offset(n: torch.Tensor, k: torch.Tensor, n_pad: int, bits: int) -> torch.Tensor:
    """Element (nibble / byte) offset of weight element ``(n, k)`` (the formula in the docstring)."""
    nb, n1, n0 = n // 16, (n // 8) % 2, n % 8
    kb, k2, k1, k0 = k // 16, (k // 8) % 2, (k // 2) % 4, k % 2
    inner = 4 * k0 + 2 * k2 + n1 if bits == 4 else 4 * k2 + 2 * k0 + n1
    return 256 * (nb + (n_pad // 16) * kb) + 32 * n0 + 8 * k1 + inner


def additive_zeros(s: torch.Tensor, z: Optional[torch.Tensor], bits: int, zero_mode: str) -> torch.Tensor:
    """``z'`` (float32, like ``s``) of the kernel's ``w = q' s + z'`` for a weight of ``zero_mode``."""
    half = float(1 << (bits - 1))
    s = s.float()
    if z is None or zero_mode == "sym":
        return torch.zeros_like(s)
    if zero_mode == "offset":
        return half * s + z.float()
    return (half - z.float()) * s


def _pack_params(p: torch.Tensor, n_pad: int, dtype: torch.dtype) -> torch.Tensor:
    n, g = p.shape
    out = torch.zeros((g, n_pad), dtype=dtype, device=p.device)
    out[:, :n] = p.t().to(dtype)
    return out


def pack(q: torch.Tensor, s: torch.Tensor, z, bits: int, dtype: torch.dtype,
         zero_mode: str = "int") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical ``(q, s, z)`` (``s``/``z`` ``(N, G)``) -> ``(b, scales, zeros)`` of this layout;
    ``zeros`` is always a tensor (the additive ``z'``; zeros for symmetric weights)."""
    _check(q, bits)
    if s.dim() != 2 or s.shape[0] != q.shape[0]:
        raise ValueError(f"s: expected ({q.shape[0]}, groups), got shape {tuple(s.shape)}")
    n_pad = round_up(q.shape[0], ATOM)
    # From the values the other layout stores (rounded to dtype), so both copies mean one weight.
    s = s.to(dtype).float()
    z = None if z is None else z.to(dtype).float()
    return (pack_b(q, bits), _pack_params(s, n_pad, dtype),
            _pack_params(additive_zeros(s, z, bits, zero_mode), n_pad, dtype))


def dims(b: torch.Tensor):
    """``(N_pad, K16)`` (padded rows, k16 atoms) of a packed ``b``."""
    return b.shape[1] * ATOM, b.shape[0]


def unpack_params(scales: torch.Tensor, zeros: torch.Tensor, bits: int, n: int, zero_mode: str = "int"):
    """``(scales, zeros)`` (``(G, N_pad)``, additive ``z'``) -> canonical ``(s, z)`` (``(n, G)``
    in the stored dtype; ``z`` None for symmetric weights); integer zero points exactly."""
    s = scales[:, :n].t().contiguous()
    if zero_mode == "sym":
        return s, None
    half = float(1 << (bits - 1))
    sf, zf = s.float(), zeros[:, :n].t().float()
    if zero_mode == "offset":
        return s, (zf - half * sf).to(s.dtype)
    # A zero scale (padding, or a dead group) leaves z' = 0 and z undetermined: report the midpoint.
    z = half - torch.where(sf != 0, zf / torch.where(sf != 0, sf, 1.0), torch.zeros_like(zf))
    if zero_mode == "int":
        z = z.round()
    return s, z.to(s.dtype)


def unpack(b: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, n: int, k: int,
           zero_mode: str = "int"):
    """``(b, scales, zeros)`` -> canonical ``(q, s, z)`` (``s``/``z`` ``(n, G)`` in the stored dtype;
    ``z`` None for symmetric weights). Exact for codes, scales and integer zero points."""
    s, z = unpack_params(scales, zeros, bits, n, zero_mode)
    return unpack_b(b, bits, n, k), s, z


def shapes(n: int, k: int, bits: int, groups: int):
    """``(b shape, scales/zeros shape)`` of an ``(n, k)`` weight with ``groups`` groups."""
    n_pad, k16 = round_up(n, ATOM), round_up(k, ATOM)
    return (k16 // ATOM, n_pad // ATOM, 8 * bits), (groups, n_pad)
