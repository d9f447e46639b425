"""The ``lowbit`` weight layout: canonical ``(q, s, z)`` of 1-, 2-, 3-bit and 1:2-sparse 7-bit
weights -> the tensors the gemv (decode) and dequantize kernels read. Pure torch, CPU or CUDA.

Same atoms as the sm90a layout (:mod:`mixed_gemm.kernels.sm90a.layout`): 16 x 16 ``(n, k)``
tiles, each one ``mma.sync.m16n8k16`` A fragment, lane ``l = 4 n0 + k1`` owning rows ``n0``,
``n0 + 8`` and columns ``2 k1``, ``2 k1 + 1``, ``+ 8``; its fragment register ``r = n1 + 2 k2``
holds the pair ``k0 = 0, 1`` (``n = 16 nb + 8 n1 + n0``, ``k = 16 kb + 8 k2 + 2 k1 + k0``). What
differs is how a lane's 8 values per atom are stored, so that any width keeps 32-bit loads that
form one coalesced 128-byte request per warp and converts with a mask, an OR and a subtraction
(1:2-sparse: compressed A fragments of mma.sp.m16n8k32 instead)::

    b: int32 (blocks, N_pad/16, W, 32)      word c of lane l for block (kq, strip nb): b[kq, nb, c, l]

    a block is 4 atoms along K (k64), W = bits words (4 for 1:2-sparse); pair p = 4 u + r (atom u):
      2 bits, bit plane: word p // 8, bits 2 (p % 8) (k0 = 0) and 16 + 2 (p % 8) (k0 = 1)
          word 0:  | p7 | p6 | ... | p0 | p7 | p6 | ... | p0 |      <- q (2 bits each)
                    31           k0 = 1  16 15          k0 = 0  0
      1 bit: word 0, bits p and 16 + p
          word 0:  | p15 .. p0 (k0 = 1) | p15 .. p0 (k0 = 0) |
      3 bits, whole fields: pair p < 15 in word p // 5, bits 3 (p % 5) and 16 + 3 (p % 5); pair 15's
      code bit c in bit 15 (k0 = 0) / 31 (k0 = 1) of word c
          word c:  | b_c | p5c+4 | .. | p5c | b_c | p5c+4 | .. | p5c |    (b_c: bit c of pair 15)
                    31    30   k0 = 1    16 15    14   k0 = 0     0
    1:2-sparse 7 bits, for mma.sp.m16n8k32 (the sparse tensor cores multiply the kept halves only):
      a block is two k32 halves h (pairs 16 h .. 16 h + 15 of a row: k 32 h + 2 p16, + 1); per row
      and pair one byte, the kept element's code in bits 0-6 (the other element is its group's zero
      code: exactly 0). Lane l = 4 g + t holds the compressed A fragment of both mma's: word
      c = 2 h + i, byte 2 n1 + j is row g + 8 n1, chunk t + 4 i (k 4 (t + 4 i) .. + 3), the kept
      element of its pair j (p16 = 2 (t + 4 i) + j). Bit 7 of the bytes is the metadata: lane t
      supplies mma (sparsity selector) t >> 1's metadata for rows g (bits 0-15) and g + 8 (16-31) at
      k 16 (t & 1) .. + 15 of that half, one bit per pair of those 16 (b = 1 when the second element
      is kept, bit 2 i' of the metadata word; pair i' = p16 - 8 (t & 1) + 8 n1); bit i' of a lane is
      bit 7 of byte i' // 4 of word i' % 4, so one shift per word puts the bits in place.

Codes are stored unsigned (the converters subtract ``2**(bits-1)`` with the magic number). ``N``
is padded to a multiple of 16 and ``K`` to whole blocks (64) with code 0; ``scales`` and
``zeros`` are ``(G, N_pad)`` in the activation dtype with the additive ``z'`` of ``w = q' s + z'``,
``q' = q - 2**(bits-1)``, exactly as the sm90a layout holds them (every zero mode folds into
``z'``; HQQ's float zeros included). It is the one copy of these widths on every GPU: the gemv
family reads it up to 32 tokens, the dequantize kernel (dequant_mm) above.
"""
from __future__ import annotations

import math
from typing import List, Tuple

import torch

from ...formats import sparse as sparse_format
from ..common import round_up
from ..sm90a import layout as sm90a_layout

NAME = "lowbit"
ATOM = 16
BLOCK_BITS = (1, 2, 3)  # 4-atom blocks: 1- and 2-bit planes, whole 3-bit fields
# mixed_gemm::kField3PerWord / kField3SpareBit (templates/atoms/lowbit.cuh; the lowbit sources
# static_assert them, constant_checks): 3-bit fields per half-word, the bit that holds pair 15's.
FIELD3_PER_WORD = 5
FIELD3_SPARE_BIT = 15
SPARSE_BITS = 7
BITS = BLOCK_BITS + (SPARSE_BITS,)
ALWAYS_ZEROS = True  # z' is always stored (zeros for symmetric weights), as in the sm90a layout


def constant_checks(bits: int) -> List[Tuple[str, int]]:
    """``(C++ expression, Python value)`` pairs that the sources reading ``bits``-bit weights
    ``static_assert`` (templates/atoms/lowbit_check.j2): the 3-bit fields' placement."""
    return [("mixed_gemm::kField3PerWord", FIELD3_PER_WORD),
            ("mixed_gemm::kField3SpareBit", FIELD3_SPARE_BIT)] if bits == 3 else []


def block_atoms(bits: int) -> int:
    """Atoms (of 16 k) per block along K: 4 (k64) for every width."""
    return 4


def words(bits: int) -> int:
    """32-bit words per lane per block."""
    return 4 if bits == SPARSE_BITS else bits


def _check_bits(bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits: the lowbit layout holds {BITS}-bit weights (7: 1:2-sparse), got {bits}")


def _check(q: torch.Tensor, bits: int) -> None:
    _check_bits(bits)
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise TypeError(f"q: expected a 2-D torch.uint8 tensor, got {q.dtype} with shape {tuple(q.shape)}")


def _coords(n_pad: int, kp: int, device):
    """The atom coordinates ``(nb, n1, n0, kb, k2, k1, k0)`` of every element of the padded
    ``(n_pad, kp)`` weight (``n = 16 nb + 8 n1 + n0``, ``k = 16 kb + 8 k2 + 2 k1 + k0``), broadcastable."""
    n = torch.arange(n_pad, device=device).view(-1, 1)
    k = torch.arange(kp, device=device).view(1, -1)
    nb, n1, n0 = n // 16, (n // 8) % 2, n % 8
    kb, k2, k1, k0 = k // 16, (k // 8) % 2, (k // 2) % 4, k % 2
    return nb, n1, n0, kb, k2, k1, k0


def _bit_slots(bits: int, n_pad: int, kp: int, device):
    """Where each element's code bits go: ``[(flat word, bit position, code bit mask or None for the
    whole code, which elements)]``, broadcastable to ``(n_pad, kp)``; an element missing from a
    slot's ``which`` stores nothing there."""
    nb, n1, n0, kb, k2, k1, k0 = _coords(n_pad, kp, device)
    strips, w = n_pad // 16, words(bits)
    kq, u = kb // 4, kb % 4
    lane, p = 4 * n0 + k1, 4 * u + n1 + 2 * k2
    base = (kq * strips + nb) * w
    every = torch.ones((), dtype=torch.bool, device=device)
    if bits == 1:
        return [((base * 32 + lane), p + 16 * k0, None, every)]
    if bits == 2:
        return [(((base + p // 8) * 32 + lane), 2 * (p % 8) + 16 * k0, None, every)]
    per, whole = FIELD3_PER_WORD, 3 * FIELD3_PER_WORD
    slots = [(((base + torch.clamp(p // per, max=2)) * 32 + lane), 3 * (p % per) + 16 * k0, None, p < whole)]
    slots += [(((base + c) * 32 + lane), FIELD3_SPARE_BIT + 16 * k0, c, p == whole) for c in range(3)]
    return slots


def _pair_bytes(n_pad: int, kp: int, device):
    """For 1:2-sparse: the flat byte index of every pair ``(n, k/2)``'s code, and of the byte whose
    bit 7 holds its metadata bit (module doc), each ``(n_pad, kp/2)``."""
    n = torch.arange(n_pad, device=device).view(-1, 1)
    p = torch.arange(kp // 2, device=device).view(1, -1)  # pair index along K
    nb, n1, g = n // 16, (n // 8) % 2, n % 8
    kq, h, p16 = p // 32, (p // 16) % 2, p % 16
    chunk, j = p16 // 2, p16 % 2
    t, i = chunk % 4, chunk // 4
    block = (kq * (n_pad // 16) + nb) * 4  # the block's first word row (c = 0)
    code = ((block + 2 * h + i) * 32 + 4 * g + t) * 4 + 2 * n1 + j
    supplier, bit = 4 * g + 2 * h + p16 // 8, p16 % 8 + 8 * n1  # its lane, and bit i' there
    meta = ((block + bit % 4) * 32 + supplier) * 4 + bit // 4
    return code, meta


def _to_int32(words64: torch.Tensor) -> torch.Tensor:
    return torch.where(words64 >= 2**31, words64 - 2**32, words64).to(torch.int32)


def _b_shape(n_pad: int, kp: int, bits: int) -> Tuple[int, ...]:
    return kp // (ATOM * block_atoms(bits)), n_pad // ATOM, words(bits), 32


def padded_k(k: int, bits: int) -> int:
    return round_up(k, ATOM * block_atoms(bits))


def pack_b(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Canonical 1-3-bit ``q`` (uint8 ``(N, K)``) -> int32 ``(blocks, N_pad/16, bits, 32)``."""
    _check(q, bits)
    if bits == SPARSE_BITS:
        raise ValueError("bits: 1:2-sparse weights pack from their pair bytes (pack_pairs)")
    n, k = q.shape
    n_pad, kp = round_up(n, ATOM), padded_k(k, bits)
    shape = _b_shape(n_pad, kp, bits)
    qp = torch.zeros((n_pad, kp), dtype=torch.int64, device=q.device)
    qp[:n, :k] = q.to(torch.int64)
    acc = torch.zeros(math.prod(shape), dtype=torch.int64, device=q.device)
    for word, bit, code_bit, which in _bit_slots(bits, n_pad, kp, q.device):
        v = qp if code_bit is None else (qp >> code_bit) & 1
        acc.index_add_(0, word.expand(n_pad, kp).reshape(-1), torch.where(which, v << bit, 0).reshape(-1))
    return _to_int32(acc).view(shape).contiguous()


def unpack_b(b: torch.Tensor, bits: int, n: int, k: int) -> torch.Tensor:
    """Exact inverse of :func:`pack_b` -> uint8 ``(n, k)``."""
    _check_bits(bits)
    n_pad, kp = round_up(n, ATOM), padded_k(k, bits)
    _expect_b(b, n_pad, kp, bits, n, k)
    flat = b.contiguous().view(-1).to(torch.int64) & 0xFFFFFFFF
    q = torch.zeros((n_pad, kp), dtype=torch.int64, device=b.device)
    for word, bit, code_bit, which in _bit_slots(bits, n_pad, kp, b.device):
        got = flat[word.expand(n_pad, kp)] >> bit
        q |= torch.where(which, got & ((1 << bits) - 1) if code_bit is None else (got & 1) << code_bit, 0)
    return q[:n, :k].to(torch.uint8).contiguous()


def _expect_b(b: torch.Tensor, n_pad: int, kp: int, bits: int, n: int, k: int) -> None:
    expect = _b_shape(n_pad, kp, bits)
    if b.dtype != torch.int32 or tuple(b.shape) != expect:
        raise ValueError(f"b: expected int32 {expect} for n={n}, k={k}, {bits} bits, got {b.dtype} {tuple(b.shape)}")


def pack_pairs(pairs: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """1:2-sparse pair bytes (format ``"sparse12"``'s ``qweight``, uint8 ``(N, K/2)``: code in bits
    0-6, bit 7 set when the first element is kept) -> int32 ``(blocks, N_pad/16, 4, 32)`` (module doc).
    Padding pairs keep their first element with code 0 (a valid metadata nibble; x is 0 there)."""
    n_pad, kp = round_up(n, ATOM), padded_k(k, SPARSE_BITS)
    padded = torch.full((n_pad, kp // 2), 0x80, dtype=torch.uint8, device=pairs.device)
    padded[:n, : k // 2] = pairs
    code, meta = _pair_bytes(n_pad, kp, pairs.device)
    out = torch.zeros(math.prod(_b_shape(n_pad, kp, SPARSE_BITS)) * 4, dtype=torch.uint8, device=pairs.device)
    out[code.reshape(-1)] = padded.reshape(-1) & 0x7F
    second = (padded.reshape(-1) >> 7) ^ 1  # the metadata bit: 1 when the second element is kept
    out[meta.reshape(-1)] |= second << 7
    return out.view(torch.int32).view(_b_shape(n_pad, kp, SPARSE_BITS)).contiguous()


def unpack_pairs(b: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Exact inverse of :func:`pack_pairs` -> uint8 ``(n, k/2)``."""
    n_pad, kp = round_up(n, ATOM), padded_k(k, SPARSE_BITS)
    _expect_b(b, n_pad, kp, SPARSE_BITS, n, k)
    code, meta = _pair_bytes(n_pad, kp, b.device)
    flat = b.contiguous().view(torch.uint8).reshape(-1)
    pairs = (flat[code.reshape(-1)] & 0x7F) | ((flat[meta.reshape(-1)] >> 7) ^ 1) << 7
    return pairs.view(n_pad, kp // 2)[:n, : k // 2].contiguous()


def _group(s: torch.Tensor, k: int) -> int:
    return -(-k // s.shape[1])


def pack(q: torch.Tensor, s: torch.Tensor, z, bits: int, dtype: torch.dtype,
         zero_mode: str = "int") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical ``(q, s, z)`` (``s``/``z`` ``(N, G)``) -> ``(b, scales, zeros)`` of this layout.
    1:2-sparse 7 bits: the pattern is checked (and the pair bytes made) by format ``"sparse12"``."""
    _check(q, bits)
    if s.dim() != 2 or s.shape[0] != q.shape[0]:
        raise ValueError(f"s: expected ({q.shape[0]}, groups), got shape {tuple(s.shape)}")
    if bits == SPARSE_BITS:
        if zero_mode not in ("int", "sym"):
            raise ValueError(f"zero_mode: 1:2-sparse 7-bit weights have integer zero codes or none, got {zero_mode!r}")
        b = pack_pairs(sparse_format.pack(q, s, z, _group(s, q.shape[1])), *q.shape)
    else:
        b = pack_b(q, bits)
    n_pad = round_up(q.shape[0], ATOM)
    s = s.to(dtype).float()
    z = None if z is None else z.to(dtype).float()
    zp = sm90a_layout.additive_zeros(s, z, bits, zero_mode)
    return b, sm90a_layout._pack_params(s, n_pad, dtype), sm90a_layout._pack_params(zp, n_pad, dtype)


def dims(b: torch.Tensor):
    """``(N_pad, K16)`` of a packed ``b``."""
    return b.shape[1] * ATOM, b.shape[0] * 4


def unpack(b: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, n: int, k: int,
           zero_mode: str = "int"):
    """``(b, scales, zeros)`` -> canonical ``(q, s, z)``: codes, scales and integer zero points exactly."""
    s, z = sm90a_layout.unpack_params(scales, zeros, bits, n, zero_mode)
    if bits == SPARSE_BITS:
        return sparse_format.unpack(unpack_pairs(b, n, k), s, z, _group(s, k)), s, z
    return unpack_b(b, bits, n, k), s, z


def shapes(n: int, k: int, bits: int, groups: int):
    """``(b shape, scales/zeros shape)`` of an ``(n, k)`` weight with ``groups`` groups."""
    n_pad, kp = round_up(n, ATOM), padded_k(k, bits)
    return _b_shape(n_pad, kp, bits), (groups, n_pad)
