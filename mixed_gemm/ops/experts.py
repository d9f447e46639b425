"""Mixture-of-experts weights: ``E`` experts' weights as one stacked prepacked copy
(:class:`PackedExperts`, made by :func:`prepack_experts`), what :func:`mixed_gemm.moe` reads.

Layout contract (:class:`PackedExperts`): expert ``e``'s weight is exactly the :class:`PackedWeight`
that :func:`prepack` makes for its ``(N, K)`` matrix, and the stacked tensors hold those
PackedWeights' tensors along a new leading dimension: ``b[e]``, ``scales[e]``, ``zeros[e]`` (each
``PackedWeight``'s shapes, contiguous, so expert ``e`` starts ``e * b[0].numel()`` elements into
``b``). A grouped kernel reads expert ``e`` at that stride; :meth:`PackedExperts.expert` is the same
expert as a zero-copy PackedWeight, which every dense family runs.

``w13`` is each expert's gate|up projection ``(2I, H)``, packed with ``gate_up=True``: the caller
gives its gate rows ``[0, I)`` then its up rows ``[I, 2I)`` (transformers' ``gate_up_proj``, vLLM's
``w13``) and the stack stores them interleaved in blocks of ``GATE_UP_BLOCK`` = 8: stored rows
``16 j .. 16 j + 7`` are gate rows ``8 j .. 8 j + 7`` and stored rows ``16 j + 8 .. 16 j + 15`` the
matching up rows (``I`` a multiple of 8). Why: every gated kernel then finds gate row ``i`` and up
row ``i`` in one thread's accumulators (an mma or wgmma accumulator holds rows ``r`` and ``r + 8``
of a 16-row block), so SiLU(gate) * up is formed in the GEMM's epilogue and only ``h (pairs, I)``
is written. :meth:`PackedExperts.expert` is the stored (interleaved) weight;
:meth:`PackedExperts.unpack_expert` and :meth:`PackedExperts.dequantize` give gate then up rows.
``w2`` is the down projection ``(H, I)``, stored as given.

The op is in :mod:`.moe`; the grouped kernels' plan in :mod:`.moe_grouped`, the per-expert path in
:mod:`.moe_per_expert`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..kernels import GROUPED_FAMILIES
from ..kernels.common import GATE_UP_BLOCK
from .packed import PackedWeight, prepack


@dataclass(frozen=True)
class PackedExperts:
    """``E`` experts' ``(N, K)`` weights, stacked (module docstring: the layout contract)."""

    b: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    n: int
    k: int
    bits: int
    group_size: int
    zero_mode: str
    layout: str
    gate_up: bool = False  # rows interleaved gate|up in blocks of GATE_UP_BLOCK (module docstring)

    @property
    def num_experts(self) -> int:
        return self.b.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.b.device

    @property
    def signature(self) -> Tuple:
        """What the choice of a grouped kernel depends on (kind, shape, layout, device)."""
        return (self.num_experts, self.n, self.k, self.bits, self.group_size, self.zero_mode, self.dtype, self.layout,
                self.gate_up, self.device.index)

    def expert(self, e: int) -> PackedWeight:
        """Expert ``e`` as a PackedWeight over the stacked tensors (no copy), rows as stored: a
        ``gate_up`` stack's are interleaved (:func:`split_gate_up` splits its products)."""
        return PackedWeight(b=self.b[e], scales=self.scales[e], zeros=None if self.zeros is None else self.zeros[e],
                            n=self.n, k=self.k, bits=self.bits, group_size=self.group_size,
                            zero_mode=self.zero_mode, perm=None, layout=self.layout, aux=())

    def unpack_expert(self, e: int):
        """Expert ``e``'s canonical ``(q, s, z)`` (``PackedWeight.unpack``), gate rows then up rows
        for a ``gate_up`` stack."""
        q, s, z = self.expert(e).unpack()
        if self.gate_up:
            q, s = gate_up_halves(q), gate_up_halves(s)
            z = None if z is None else gate_up_halves(z)
        return q, s, z

    def dequantize(self) -> torch.Tensor:
        """float32 ``(E, N, K)``: every expert's weight (gate rows then up rows), for the reference."""
        from ..reference import dequantize

        out = []
        for e in range(self.num_experts):
            q, s, z = self.unpack_expert(e)
            out.append(dequantize(q, s, z, group_size=self.group_size if s.shape[-1] > 1 else -1, bits=self.bits,
                                  zero_mode="offset" if self.zero_mode == "offset" else "int"))
        return torch.stack(out)


def gate_up_interleaved(t: torch.Tensor) -> torch.Tensor:
    """Rows (dim -2) ``[gate (I); up (I)]`` of ``t`` into the stored order of a ``gate_up`` stack."""
    *lead, n, cols = t.shape
    return t.reshape(*lead, 2, n // (2 * GATE_UP_BLOCK), GATE_UP_BLOCK, cols).transpose(-4, -3).reshape(t.shape)


def gate_up_halves(t: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`gate_up_interleaved`: stored rows back to gate rows then up rows."""
    *lead, n, cols = t.shape
    return t.reshape(*lead, n // (2 * GATE_UP_BLOCK), 2, GATE_UP_BLOCK, cols).transpose(-4, -3).reshape(t.shape)


def split_gate_up(h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)``, each ``(..., I // 8, 8)`` views, of a product ``h (..., 2I)`` with a
    ``gate_up`` stack's expert (columns in the stored, interleaved order)."""
    blocks = h.reshape(*h.shape[:-1], h.shape[-1] // (2 * GATE_UP_BLOCK), 2, GATE_UP_BLOCK)
    return blocks[..., 0, :], blocks[..., 1, :]


def prepack_experts(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], *, bits: int = 4,
                    group_size: int = 128, zero_mode: str = "int", dtype: torch.dtype = torch.float16,
                    layout: str = "auto", gate_up: bool = False) -> PackedExperts:
    """Canonical per-expert ``q`` ``(E, N, K)``, ``s``/``z`` ``(E, N, num_groups)`` (``z``: ``None``
    for symmetric weights), as :func:`mixed_gemm.quantize` makes them expert by expert, into one
    :class:`PackedExperts` on their device. Each expert goes through :func:`prepack` (its rules and
    errors); ``layout`` as there (one layout: a grouped kernel reads one), except that ``"auto"``
    takes the grouped families' layout on a GPU where one of them runs (:func:`experts_layout`:
    on Ampere too, where dense weights get the sm80 layout). ``gate_up=True`` for ``moe``'s ``w13``:
    the rows are gate rows then up rows (``N = 2I``, ``I`` a multiple of 8), stored interleaved
    (module docstring)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected (E, N, K) codes, got shape {tuple(q.shape)}")
    if layout not in ("auto", "sm80", "sm90a"):
        raise ValueError(f"layout: experts hold one layout, 'auto', 'sm80' or 'sm90a'; got {layout!r}")
    if gate_up:
        if q.shape[1] % (2 * GATE_UP_BLOCK):
            raise ValueError(f"q: a gate|up stack (gate_up=True) has 2I rows with I a multiple of {GATE_UP_BLOCK} "
                             f"(gate and up rows are stored in interleaved blocks of {GATE_UP_BLOCK}), got N={q.shape[1]}")
        if s.dim() != 3 or s.shape[1] != q.shape[1] or (z is not None and z.shape[:2] != s.shape[:2]):
            raise ValueError(f"s, z: expected (E, N={q.shape[1]}, num_groups) like q's rows, got "
                             f"{tuple(s.shape)} and {None if z is None else tuple(z.shape)}")
        q, s = gate_up_interleaved(q), gate_up_interleaved(s)
        z = None if z is None else gate_up_interleaved(z)
    if layout == "auto":
        layout = experts_layout(q.device)
    parts = [prepack(q[e], s[e], None if z is None else z[e], format="plain", bits=bits, group_size=group_size,
                     zero_mode=zero_mode, dtype=dtype, layout=layout) for e in range(q.shape[0])]
    first = parts[0]
    return PackedExperts(b=torch.stack([p.b for p in parts]), scales=torch.stack([p.scales for p in parts]),
                         zeros=None if first.zeros is None else torch.stack([p.zeros for p in parts]),
                         n=first.n, k=first.k, bits=first.bits, group_size=first.group_size,
                         zero_mode=first.zero_mode, layout=first.layout, gate_up=gate_up)


def experts_layout(device: torch.device) -> str:
    """The layout ``prepack_experts(layout="auto")`` gives experts on ``device``: the one the first
    grouped family that runs there reads (``sm90a``: moe_sm90a on the H100, moe_gemv's mma.sync
    kernels from compute capability 8.0, which also read it), so that ``moe`` has a grouped,
    capturable path; ``"auto"`` (prepack's choice) elsewhere. Dense selection serves either layout
    (the per-expert path: gemv at decode sizes, dequantize + cuBLAS above)."""
    if device.type != "cuda":
        return "auto"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return next((fam.layout for fam in GROUPED_FAMILIES if fam.supports(index)[0]), "auto")


def check_moe_inputs(x, w13: PackedExperts, w2: PackedExperts, topk_weights, topk_ids) -> None:
    """``moe``'s rules (and ``moe_grouped``'s), each a ValueError/TypeError naming the argument, before
    anything runs."""
    if not isinstance(w13, PackedExperts) or not isinstance(w2, PackedExperts):
        raise TypeError(f"w13, w2: expected PackedExperts (mixed_gemm.prepack_experts), got "
                        f"{type(w13).__name__} and {type(w2).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a (T, H) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    t, h = x.shape
    if not w13.gate_up:
        raise ValueError("w13: expected a gate|up stack, prepack_experts(..., gate_up=True) (gate and up rows "
                         f"interleaved in blocks of {GATE_UP_BLOCK}, the order the gated kernels read), got plain rows")
    if w2.gate_up:
        raise ValueError("w2: the down projection is stacked with plain rows (prepack_experts' gate_up=False)")
    inter = w13.n // 2
    if w13.k != h:
        raise ValueError(f"w13: expected K = H = {h} (x's last dimension), got K={w13.k}")
    if (w2.num_experts, w2.n, w2.k) != (w13.num_experts, h, inter):
        raise ValueError(f"w2: expected (E, H, I) = ({w13.num_experts}, {h}, {inter}) to match w13 and x, got "
                         f"({w2.num_experts}, {w2.n}, {w2.k})")
    if x.dtype != w13.dtype or w2.dtype != w13.dtype:
        raise TypeError(f"x: dtype must equal the experts' ({w13.dtype}), got x {x.dtype}, w2 {w2.dtype}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids, topk_weights: expected equal (T={t}, top_k) shapes, got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected int32 or int64 expert ids, got {topk_ids.dtype}")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights: expected floating point, got {topk_weights.dtype}")
    for name, tensor in (("w13", w13.b), ("w2", w2.b), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if tensor.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (same as x), got {tensor.device}")
