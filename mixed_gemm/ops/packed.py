"""``PackedWeight``: a quantized weight in the kernel's layout, and ``prepack`` to build one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from ..formats import make_g_idx, resolve_zero_mode, unpack
from ..kernels import LAYOUTS, layout_for, layout_names
from ..kernels.common import PER_CHANNEL_SHIFT

KERNEL_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
KERNEL_BITS = (1, 2, 3, 4, 7, 8)
LOWBIT_BITS = LAYOUTS["lowbit"].BITS  # one layout on every device: "lowbit" (7: 1:2-sparse only)


class LayoutView(NamedTuple):
    """One layout's tensors of a PackedWeight, and what a kernel's cached arguments depend on."""

    b: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    n_pad: int
    key: Tuple


@dataclass(eq=False, frozen=True)
class PackedWeight:
    """A quantized ``(N, K)`` weight prepared for :func:`mixed_gemm.matmul`.

    ``layout`` names the weight layout of ``b``/``scales``/``zeros``: ``"sm80"`` (Ampere/Ada, the
    CPU; :mod:`mixed_gemm.kernels.sm80.layout` has the exact contract) or ``"sm90a"`` (the H100:
    :mod:`mixed_gemm.kernels.sm90a.layout`, read by the sm90a, gemv and dequantize kernels), one
    copy either way; ``prepack`` picks the device's (:func:`mixed_gemm.kernels.layout_for`). On
    request ``"sm80+sm90a"`` holds both: then ``aux`` is the sm90a copy ``(b, scales, zeros)``,
    about the weight's size again. 1-3-bit and 1:2-sparse 7-bit weights hold ``"lowbit"`` on every
    device (:mod:`mixed_gemm.kernels.gemv.lowbit_layout`; scales and zeros as in sm90a). The
    families that read one of the held layouts can run this weight. Tensors (all on one device):

    - ``b``: int32 atoms (sm80: ``(N_pad/64, K_pad/16, 128 * bits / 4)``; sm90a:
      ``(K_pad/16, N_pad/16, 8 * bits)``; lowbit: see its module), ``K_pad = ceil(K/16)*16``;
    - ``scales``: ``(num_groups, N_pad)`` in ``dtype`` (the activation dtype);
    - ``zeros``: like ``scales``. sm80: what ``zero_mode`` says, or ``None`` for symmetric weights
      (zero point ``2**(bits-1)``): ``"int"`` integer zero points z and ``"float"`` arbitrary
      ones, both meaning ``w = (q - z) s``; ``"offset"`` offsets m, ``w = q s + m``. sm90a: always
      the additive zero ``z'`` of ``w = (q - 2**(bits-1)) s + z'`` that every mode folds into;
    - ``perm``: for GPTQ act-order, the K permutation applied to ``b`` (``x`` is gathered with it
      on every call), else ``None``.

    ``group_size`` is the number of consecutive (permuted) K elements sharing a scale (``K`` for
    per-channel). Frozen: build a new one (cheap, no copy) rather than swapping its tensors.
    """

    b: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    n: int
    k: int
    bits: int
    group_size: int
    zero_mode: str = "int"
    perm: Optional[torch.Tensor] = None
    layout: str = "sm80"
    aux: Tuple[torch.Tensor, ...] = ()
    # Derived once (the hot path reads them on every call; the weight is frozen):
    device: torch.device = field(init=False, repr=False)
    dtype: torch.dtype = field(init=False, repr=False)
    kernel_dtype: str = field(init=False, repr=False)
    n_pad: int = field(init=False, repr=False)
    k16: int = field(init=False, repr=False)
    num_groups: int = field(init=False, repr=False)
    group_shift: int = field(init=False, repr=False)
    signature: Tuple = field(init=False, repr=False)   # what selection depends on (with M's bucket)
    parts: Dict[str, LayoutView] = field(init=False, repr=False)  # layout name -> its tensors

    def __post_init__(self):
        put = object.__setattr__
        names = layout_names(self.layout)
        if self.zeros is None:
            put(self, "zero_mode", "sym")
            if LAYOUTS[names[0]].ALWAYS_ZEROS:
                raise ValueError(f"zeros: the {names[0]!r} layout always stores zeros (0 for symmetric weights)")
        if len(self.aux) != 3 * (len(names) - 1):
            raise ValueError(f"aux: layout {self.layout!r} needs {3 * (len(names) - 1)} aux tensors "
                             f"(b, scales, zeros of the second layout), got {len(self.aux)}")
        if self.scales.dtype not in KERNEL_DTYPES:
            raise TypeError(f"scales: must be float16 or bfloat16 (the activation dtype), got {self.scales.dtype}")
        num_groups = self.scales.shape[0]
        n_pad, k16 = LAYOUTS[names[0]].dims(self.b)
        derived = dict(
            device=self.b.device, dtype=self.scales.dtype, kernel_dtype=KERNEL_DTYPES[self.scales.dtype],
            n_pad=n_pad, k16=k16, num_groups=num_groups,
            group_shift=PER_CHANNEL_SHIFT if num_groups == 1 else self.group_size.bit_length() - 1)
        for name, value in derived.items():
            put(self, name, value)
        put(self, "signature", (self.n, self.k, self.bits, self.group_size, self.zero_mode, self.kernel_dtype,
                                self.layout, self.device.index))
        parts = {}
        for name, (b, sc, z) in zip(names, ((self.b, self.scales, self.zeros), tuple(self.aux))):
            key = (b.data_ptr(), sc.data_ptr(), 0 if z is None else z.data_ptr(), self.n, self.k, self.group_size)
            parts[name] = LayoutView(b, sc, z, sc.shape[1], key + (sc.shape[1],))
        put(self, "parts", parts)

    @property
    def layouts(self) -> Tuple[str, ...]:
        """The layouts held, ``b``'s first."""
        return tuple(self.layout.split("+"))

    @property
    def nbytes(self) -> int:
        """Device bytes of every tensor held (both copies where there are two)."""
        tensors = (self.b, self.scales, self.zeros, self.perm) + tuple(self.aux)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def unpack(self):
        """The canonical ``(q, s, z)`` back, in the kernel's (possibly act-order permuted) K order
        (from an sm90a-only weight: float zeros and offsets to the precision of its ``z'``)."""
        return LAYOUTS[self.layouts[0]].unpack(self.b, self.scales, self.zeros, self.bits, self.n, self.k,
                                               self.zero_mode)

    def __repr__(self) -> str:
        return (
            f"PackedWeight(n={self.n}, k={self.k}, bits={self.bits}, group_size={self.group_size}, "
            f"zero_mode={self.zero_mode!r}, dtype={self.dtype}, act_order={self.perm is not None}, "
            f"layout={self.layout!r}, device={self.device})"
        )


def _act_order_perm(g_idx: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """The K permutation that makes act-order groups contiguous: sorting g_idx (stably) must give
    exactly ``arange(K) // group_size``, i.e. every group has ``group_size`` members."""
    perm = torch.argsort(g_idx.long(), stable=True)
    if not torch.equal(g_idx.long()[perm], make_g_idx(k, group_size, device=g_idx.device).long()):
        raise ValueError(f"g_idx: every group must have exactly group_size={group_size} members")
    return perm


def prepack(qweight, scales, zeros=None, *, format: str = "awq", bits: int = 4, group_size: int = 128,
            g_idx=None, zero_mode: str = "int", dtype: torch.dtype = torch.float16,
            layout: str = "auto", shape=None) -> PackedWeight:
    """Convert a checkpoint's tensors (see :func:`mixed_gemm.unpack` for ``format``) into a
    :class:`PackedWeight` on the same device, for activations of ``dtype`` (float16 or bfloat16).

    ``zero_mode`` says what ``zeros`` holds, as in :func:`mixed_gemm.unpack`: ``"int"`` (default)
    integer zero points, ``w = (q - z) s``; ``"float"`` any float zero point, same formula (HQQ);
    ``"offset"``: ``w = q s + m`` (GGUF Q4_1). The last two need ``format="plain"``.
    ``g_idx`` (GPTQ act-order): K is reordered once here so groups are contiguous; ``matmul``
    reorders ``x`` the same way on every call. ``layout``: the weight layout to pack into
    (``"sm80"``, ``"sm90a"``, or ``"sm80+sm90a"`` for both copies); ``"auto"`` takes the one the
    tile families of the tensors' device read (:func:`mixed_gemm.kernels.layout_for`): ``"sm80"``
    on Ampere/Ada and the CPU, ``"sm90a"`` on the H100. One copy either way.

    ``format="hqq"`` (the ``hqq`` package's packed ``W_q``, ``meta["scale"]``, ``meta["zero"]``) needs
    ``shape=(N, K)``; its zeros are float zero points.

    1-, 2-, 3-bit weights and 1:2-sparse 7-bit ones (``format="sparse12"``, or a canonical 7-bit
    weight with a zero code in every pair along K) go into the ``"lowbit"`` layout on every device
    (:mod:`mixed_gemm.kernels.gemv.lowbit_layout`), read by the gemv and dequantize kernels.

    Rules (each raises ``ValueError`` naming it): ``bits`` is 1, 2, 3, 4, 7 (1:2-sparse) or 8 (the kernels' widths); ``K`` is a multiple of 8 (rows of ``x`` are
    copied 16 bytes at a time); ``N`` is even (outputs are stored in pairs); ``group_size`` is -1
    (per-channel), ``K``, or a power of two >= 32 (a k16 step of the kernel must not straddle
    groups, and a k-tile touches at most BK/32 of them). Any other ``N``/``K`` is padded here
    (to 64 / 16) and the kernel never reads the padding into a result.
    """
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"dtype: must be torch.float16 or torch.bfloat16, got {dtype}")
    if layout != "auto":
        layout_names(layout)
    q, s, z = unpack(qweight, scales, zeros, format=format, bits=bits, group_size=group_size, g_idx=g_idx,
                     zero_mode=zero_mode, shape=shape)
    if bits not in KERNEL_BITS:
        raise ValueError(f"bits: the kernels serve {KERNEL_BITS}-bit weights (7: 1:2-sparse); {bits}-bit weights "
                         f"unpack, quantize and dequantize (mixed_gemm.reference) but have no kernel, got bits={bits}")
    zero_mode = resolve_zero_mode(zero_mode, format)  # hqq: float zero points, whatever the argument
    n, k = q.shape
    num_groups = s.shape[1]
    g = k if (group_size == -1 or num_groups == 1) else group_size
    if n % 2:
        raise ValueError(f"N: must be even (the kernel stores pairs of outputs), got N={n}")
    if k % 8:
        raise ValueError(f"K: must be a multiple of 8 (x rows are loaded 16 bytes at a time), got K={k}")
    if num_groups > 1 and (g < 32 or g & (g - 1)):
        raise ValueError(f"group_size: must be -1 or a power of two >= 32, got {g}")
    if zero_mode == "offset" and z is None:
        raise ValueError("zeros: zero_mode='offset' needs the per-group offsets m")
    perm = None
    if g_idx is not None:
        perm = _act_order_perm(torch.as_tensor(g_idx, device=q.device), k, g)
        q = q.index_select(1, perm)
    mode = "sym" if z is None else zero_mode
    if layout == "auto":
        layout = layout_for(q.device.index if q.device.type == "cuda" else None, bits)
    names = layout_names(layout)
    if (names == ("lowbit",)) != (bits in LOWBIT_BITS):
        raise ValueError(f"layout: {LOWBIT_BITS}-bit weights (7: 1:2-sparse) are packed into 'lowbit', the layout "
                         f"of those widths on every device, and only they; got layout={layout!r} for bits={bits}")
    b, sp, zp = LAYOUTS[names[0]].pack(q, s, z, bits, dtype, mode)
    aux = tuple(LAYOUTS[names[1]].pack(q, s, z, bits, dtype, mode)) if len(names) > 1 else ()
    return PackedWeight(b=b, scales=sp, zeros=zp, n=n, k=k, bits=bits, group_size=g, zero_mode=mode, perm=perm,
                        layout=layout, aux=aux)
