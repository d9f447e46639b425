"""The ``sm80`` weight layout: canonical ``(q, s, z)`` <-> the tensors the sm80 GEMM (and the
dequantize kernel of the dequant_mm family) read.

Pure torch, vectorized, exact inverses, CPU or CUDA. Where element ``(n, k)`` of ``q`` lands::

        k ->  0        16       32              K_pad        b: int32 (N_pad/64, K_pad/16, 128*bits/4)
    n   0   +--------+--------+-- ... --+              one row of atoms per 64-column strip,
    |       | atom   | atom   |         |              contiguous along K:
    v       | (0,0)  | (0,1)  |         |              atom (na, ka) = b[na, ka, :]
       64   +--------+--------+-- ... --+
            | atom   |        |         |              inside an atom (16 k x 64 n):
            | (1,0)  |  ...   |         |                lane t = 4 (dn % 8) + (dk % 8) // 2
       128  +--------+--------+-- ... --+                word = [chunk][register][lane]
                                                         slot in the word: the table below
    scales/zeros: (groups, N_pad); column 8 j + g of each 64-column block stored at 8 g + j

B (the quantized weight) is cut into **atoms** of 16 (k) x 64 (n) elements. Atom ``(na, ka)``
(``na < N_pad/64``, ``ka < K16 = K_pad/16``) occupies bytes ``[(na*K16 + ka) * A, +A)`` with
``A = 512 * bits / 4``: the atoms of one 64-column strip are contiguous along K, so a threadblock
streams each strip as one run. Inside an atom the bytes are ``[chunk c][register i][lane t][4]``
(``bits/4`` chunks of 512 bytes). In the kernel lane ``t`` points ``ldmatrix.x4`` at
``chunk + 16 t``; ldmatrix hands lane ``t`` the 32-bit word at ``128 i + 4 t`` as register ``i``,
which is the word this module filled with lane ``t``'s ``mma.sync`` B-fragment elements.

``mma.sync.m16n8k16`` wants, in lane ``t`` (``g = t // 4``, ``k0 = 2 (t % 4)``), column ``n = g``
of an n8 tile and rows ``k0, k0+1`` (register b0) and ``k0+8, k0+9`` (register b1), low half
first. The fast converters (templates/mixed_gemm/dequant.cuh) produce half2 pairs from a word in a
fixed order, so the slots of a word hold::

    int4 word (register i): nibble p -> n8 tile 2i + (p>>1 & 1), k offset (p>=4) + 8 (p & 1)
        nibble: 0      1       2        3        4       5       6        7
        (tile,k) (2i,k0) (2i,k0+8) (2i+1,k0) (2i+1,k0+8) (2i,k0+1) (2i,k0+9) (2i+1,k0+1) (2i+1,k0+9)
    int8 word (chunk c, register i): byte p -> n8 tile 4c + i, k offset (p & 2)/2 + 8 (p & 1)
        byte:   0      1       2       3
        k:      k0     k0+8    k0+1    k0+9

Element ``(n, k)`` therefore lands in atom ``(n // 64, k // 16)``; with ``dn = n % 64``,
``dk = k % 16``: lane ``t = 4 (dn % 8) + (dk % 8) // 2``, tile ``dn // 8``, and the slot above.

Scales and zeros become fp16 ``(num_groups, N_pad)`` row-major; inside each 64-column block column
``8 j + g`` moves to position ``8 g + j`` (an 8x8 transpose), so lane ``g`` reads the values of its
8 tiles as one 16-byte vector. ``N`` is padded to ``N_pad`` (multiple of 64) and ``K`` to
``K_pad`` (multiple of 16) with zeros; the kernel never lets padding reach the output.
"""
from __future__ import annotations

import functools

import torch

from ..common import ATOM_K, ATOM_N, round_up

NAME = "sm80"



@functools.lru_cache(maxsize=None)
def _atom_source_index(bits: int) -> torch.Tensor:
    """For each (word, slot) of an atom in storage order, the flat index ``dn * 16 + dk``."""
    slots = 32 // bits
    words = torch.arange(ATOM_N * ATOM_K // slots)
    chunk, reg, lane = words // 128, (words // 32) % 4, words % 32
    p = torch.arange(slots)
    g, k0 = (lane // 4)[:, None], (2 * (lane % 4))[:, None]
    if bits == 4:
        tile = 2 * reg[:, None] + ((p >> 1) & 1)[None, :]
        koff = (p >= 4).long()[None, :] + 8 * (p & 1)[None, :]
    else:
        tile = (4 * chunk + reg)[:, None].expand(-1, slots)
        koff = ((p & 2) // 2)[None, :] + 8 * (p & 1)[None, :]
    dn = tile * 8 + g
    dk = k0 + koff
    return (dn * ATOM_K + dk).reshape(-1)


def _check_bits(bits: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"bits: must be 4 or 8, got {bits}")


def pack_b(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Canonical ``q`` (uint8 ``(N, K)``, values in ``[0, 2**bits)``) -> int32 atoms
    ``(N_pad/64, K_pad/16, 128 * bits / 4)``; padding is zero."""
    _check_bits(bits)
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise TypeError(f"q: expected a 2-D torch.uint8 tensor, got {q.dtype} with shape {tuple(q.shape)}")
    n, k = q.shape
    n_pad, k_pad = round_up(n, ATOM_N), round_up(k, ATOM_K)
    qp = torch.zeros((n_pad, k_pad), dtype=torch.int64, device=q.device)
    qp[:n, :k] = q
    atoms = qp.view(n_pad // ATOM_N, ATOM_N, k_pad // ATOM_K, ATOM_K).permute(0, 2, 1, 3)
    atoms = atoms.reshape(n_pad // ATOM_N, k_pad // ATOM_K, ATOM_N * ATOM_K)
    idx = _atom_source_index(bits).to(q.device)
    slots = 32 // bits
    vals = atoms.index_select(2, idx).view(*atoms.shape[:2], -1, slots)
    shifts = torch.arange(slots, device=q.device) * bits
    words = (vals << shifts).sum(-1)  # < 2**32 in int64
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement into int32
    return words.to(torch.int32).contiguous()


def unpack_b(b: torch.Tensor, bits: int, n: int, k: int) -> torch.Tensor:
    """Exact inverse of :func:`pack_b`: int32 atoms -> uint8 ``(n, k)``."""
    _check_bits(bits)
    n_pad, k_pad = round_up(n, ATOM_N), round_up(k, ATOM_K)
    slots = 32 // bits
    expect = (n_pad // ATOM_N, k_pad // ATOM_K, ATOM_N * ATOM_K // slots)
    if b.dtype != torch.int32 or tuple(b.shape) != expect:
        raise ValueError(f"b: expected int32 atoms of shape {expect} for n={n}, k={k}, got {b.dtype} {tuple(b.shape)}")
    words = b.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(slots, device=b.device) * bits
    vals = ((words[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*b.shape[:2], -1)
    idx = _atom_source_index(bits).to(b.device)
    atoms = torch.empty_like(vals)
    atoms[..., idx] = vals
    q = atoms.view(n_pad // ATOM_N, k_pad // ATOM_K, ATOM_N, ATOM_K).permute(0, 2, 1, 3).reshape(n_pad, k_pad)
    return q[:n, :k].to(torch.uint8).contiguous()


def pack_group_params(s: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Canonical ``(N, G)`` scales or zeros -> ``(G, N_pad)`` in ``dtype`` with the 8x8 transpose
    inside each 64-column block (see module docstring); padding is zero."""
    if s.dim() != 2:
        raise ValueError(f"s: expected a 2-D (N, groups) tensor, got shape {tuple(s.shape)}")
    n, g = s.shape
    n_pad = round_up(n, ATOM_N)
    out = torch.zeros((g, n_pad), dtype=dtype, device=s.device)
    out[:, :n] = s.t().to(dtype)
    return out.view(g, n_pad // ATOM_N, 8, 8).transpose(-1, -2).reshape(g, n_pad).contiguous()


def unpack_group_params(p: torch.Tensor, n: int) -> torch.Tensor:
    """Exact inverse of :func:`pack_group_params` (values stay in ``p``'s dtype): -> ``(n, G)``."""
    g, n_pad = p.shape
    if n_pad != round_up(n, ATOM_N):
        raise ValueError(f"p: expected {round_up(n, ATOM_N)} columns for n={n}, got {n_pad}")
    return p.view(g, n_pad // ATOM_N, 8, 8).transpose(-1, -2).reshape(g, n_pad)[:, :n].t().contiguous()


ALWAYS_ZEROS = False  # symmetric weights store no zeros (the kernels take the zero point 2**(bits-1))


def dims(b: torch.Tensor):
    """``(N_pad, K16)`` (padded rows, k16 atoms) of a packed ``b``."""
    return b.shape[0] * ATOM_N, b.shape[1]


def pack(q: torch.Tensor, s: torch.Tensor, z, bits: int, dtype: torch.dtype, zero_mode: str = "int"):
    """Canonical ``(q, s, z)`` -> ``(b, scales, zeros)`` of this layout (``zeros`` None if ``z`` is;
    ``zero_mode`` is the kernels' business here, stored beside the weight)."""
    return (pack_b(q, bits), pack_group_params(s, dtype), None if z is None else pack_group_params(z, dtype))


def unpack(b: torch.Tensor, scales: torch.Tensor, zeros, bits: int, n: int, k: int, zero_mode: str = "int"):
    """Exact inverse of :func:`pack`: ``(q, s, z)`` with ``s``/``z`` in the stored dtype."""
    return (unpack_b(b, bits, n, k), unpack_group_params(scales, n),
            None if zeros is None else unpack_group_params(zeros, n))


def shapes(n: int, k: int, bits: int, groups: int):
    """``(b shape, scales/zeros shape)`` of an ``(n, k)`` weight with ``groups`` groups (for empty
    buffers, e.g. QuantLinear's before loading a state dict)."""
    n_pad, k_pad = round_up(n, ATOM_N), round_up(k, ATOM_K)
    return (n_pad // ATOM_N, k_pad // ATOM_K, ATOM_N * ATOM_K * bits // 32), (groups, n_pad)
