"""``PackedWeight``: a quantized weight in the kernel's layout, and ``prepack`` to build one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

from ..formats import unpack
from ..formats.kernel_layout import ATOM_N, pack_b, pack_group_params, unpack_b, unpack_group_params

PER_CHANNEL_SHIFT = 30  # group_shift meaning "one group per column": k >> 30 is 0 for every k


@dataclass(eq=False)
class PackedWeight:
    """A quantized ``(N, K)`` weight prepared for :func:`mixed_gemm.matmul`.

    Tensors (all on one device; see :mod:`mixed_gemm.formats.kernel_layout` for the exact layout):

    - ``b``: int32 atoms ``(N_pad/64, K_pad/16, 128 * bits / 4)``, ``N_pad = ceil(N/64)*64``,
      ``K_pad = ceil(K/16)*16``;
    - ``scales``: fp16 ``(num_groups, N_pad)``, 64-column blocks 8x8-transposed;
    - ``zeros``: like ``scales`` holding the integer zero points, or ``None`` for symmetric weights
      (zero point ``2**(bits-1)``).

    ``group_size`` is the number of consecutive K elements sharing a scale (``K`` for per-channel).
    """

    b: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    n: int
    k: int
    bits: int
    group_size: int
    _configs: Dict[int, object] = field(default_factory=dict, repr=False)  # M bucket -> KernelConfig

    @property
    def device(self) -> torch.device:
        return self.b.device

    @property
    def n_pad(self) -> int:
        return self.b.shape[0] * ATOM_N

    @property
    def k16(self) -> int:
        return self.b.shape[1]

    @property
    def num_groups(self) -> int:
        return self.scales.shape[0]

    @property
    def group_shift(self) -> int:
        return PER_CHANNEL_SHIFT if self.num_groups == 1 else self.group_size.bit_length() - 1

    @property
    def zero_mode(self) -> str:
        return "sym" if self.zeros is None else "int"

    def unpack(self):
        """The canonical ``(q, s, z)`` back (fp16 ``s``/``z``): the exact inverse of the layout."""
        q = unpack_b(self.b, self.bits, self.n, self.k)
        s = unpack_group_params(self.scales, self.n)
        z = None if self.zeros is None else unpack_group_params(self.zeros, self.n)
        return q, s, z

    def __repr__(self) -> str:
        return (
            f"PackedWeight(n={self.n}, k={self.k}, bits={self.bits}, group_size={self.group_size}, "
            f"zero_mode={self.zero_mode!r}, device={self.device})"
        )


def prepack(qweight, scales, zeros=None, *, format: str = "awq", bits: int = 4, group_size: int = 128,
            g_idx=None) -> PackedWeight:
    """Convert a checkpoint's tensors (see :func:`mixed_gemm.unpack` for ``format``) into a
    :class:`PackedWeight` on the same device.

    Rules (each raises ``ValueError`` naming it): ``K`` is a multiple of 8 (rows of ``x`` are
    copied 16 bytes at a time); ``group_size`` is -1 (per-channel), ``K``, or a power of two >= 32
    (a k16 step of the kernel must not straddle groups, and a k-tile touches at most BK/32 of
    them). ``N`` may be any size the format allows: it is padded to 64 here and the kernel never
    writes the padding. Scales are stored in fp16.
    """
    if g_idx is not None:
        raise ValueError("g_idx: act-order weights (GPTQ desc_act) are not supported by prepack yet")
    q, s, z = unpack(qweight, scales, zeros, format=format, bits=bits, group_size=group_size)
    n, k = q.shape
    num_groups = s.shape[1]
    g = k if num_groups == 1 else k // num_groups
    if n % 2:
        raise ValueError(f"N: must be even (the kernel stores pairs of outputs), got N={n}")
    if k % 8:
        raise ValueError(f"K: must be a multiple of 8 (x rows are loaded 16 bytes at a time), got K={k}")
    if num_groups > 1 and (g < 32 or g & (g - 1)):
        raise ValueError(f"group_size: must be -1 or a power of two >= 32, got {g}")
    if s.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"scales: expected a floating dtype, got {s.dtype}")
    return PackedWeight(
        b=pack_b(q, bits),
        scales=pack_group_params(s, torch.float16),
        zeros=None if z is None else pack_group_params(z, torch.float16),
        n=n,
        k=k,
        bits=bits,
        group_size=g,
    )
