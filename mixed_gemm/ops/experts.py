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

NO_EXPERT = -1
"""The expert id of a (token, slot) pair that contributes nothing: expert parallelism marks the
pairs of experts that live on another rank so (``moe``'s docstring)."""


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
    (module docstring).

    Checked here for the whole stack before any expert is packed (one host read of the values: a
    one-time cost), each a ``ValueError``/``TypeError`` naming the argument: ``q`` integer
    ``(E, N, K)`` with ``E, N, K >= 1`` and codes in ``[0, 2**bits)``; ``s`` floating ``(E, N, NG)``
    with ``NG = ceil(K / group_size)`` (1 for ``group_size=-1``), finite; ``z`` ``None`` or ``s``'s
    shape, finite; one device; then :func:`prepack`'s rules per expert."""
    _check_canonical(q, s, z, bits, group_size, gate_up)
    if layout not in ("auto", "sm80", "sm90a"):
        raise ValueError(f"layout: experts hold one layout, 'auto', 'sm80' or 'sm90a'; got {layout!r}")
    if gate_up:
        if q.shape[1] % (2 * GATE_UP_BLOCK):
            raise ValueError(f"q: a gate|up stack (gate_up=True) has 2I rows with I a multiple of {GATE_UP_BLOCK} "
                             f"(gate and up rows are stored in interleaved blocks of {GATE_UP_BLOCK}), got N={q.shape[1]}")
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


def _check_canonical(q, s, z, bits, group_size, gate_up) -> None:
    """prepack_experts' rules for the stack as a whole (its docstring)."""
    for name, t in (("q", q), ("s", s), ("z", z)):
        if not (isinstance(t, torch.Tensor) or (name == "z" and t is None)):
            raise TypeError(f"{name}: expected a torch.Tensor{' or None' if name == 'z' else ''}, got "
                            f"{type(t).__name__}")
    if not isinstance(gate_up, bool):
        raise TypeError(f"gate_up: expected a bool, got {type(gate_up).__name__}")
    if q.is_floating_point() or q.is_complex() or q.dtype == torch.bool:
        raise TypeError(f"q: expected integer codes, got dtype {q.dtype}")
    if q.dim() != 3 or 0 in q.shape:
        raise ValueError(f"q: expected non-empty (E, N, K) codes, got shape {tuple(q.shape)}")
    if not s.is_floating_point():
        raise TypeError(f"s: expected floating-point scales, got dtype {s.dtype}")
    e, n, k = q.shape
    groups = None
    if isinstance(group_size, int) and not isinstance(group_size, bool) and (group_size == -1 or group_size > 0):
        groups = 1 if group_size == -1 else -(-k // group_size)
    if s.dim() != 3 or s.shape[:2] != (e, n) or (groups is not None and s.shape[2] != groups):
        want = f"({e}, {n}, {groups if groups is not None else 'num_groups'})"
        raise ValueError(f"s: expected (E, N, ceil(K / group_size)) = {want} for q {tuple(q.shape)} and "
                         f"group_size={group_size!r} (one scale per expert, row and group), got {tuple(s.shape)}")
    if z is not None and z.shape != s.shape:
        raise ValueError(f"z: expected shape {tuple(s.shape)} (same as s), got {tuple(z.shape)}")
    for name, t in (("s", s), ("z", z)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {t.device}")
    # One host read for the whole stack: the codes' range and whether any scale or zero is not finite.
    flags = [q.min().long().view(1), q.max().long().view(1), (~torch.isfinite(s)).any().long().view(1)]
    if z is not None and z.is_floating_point():
        flags.append((~torch.isfinite(z)).any().long().view(1))
    lo, hi, *bad = torch.cat(flags).tolist()
    if isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 8 and (lo < 0 or hi >= 1 << bits):
        raise ValueError(f"q: expected codes in [0, {1 << bits}) for bits={bits}, got {lo if lo < 0 else hi}")
    if bad[0]:
        raise ValueError("s: expected finite scales, got nan/inf")
    if len(bad) > 1 and bad[1]:
        raise ValueError("z: expected finite zeros, got nan/inf")


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


def check_routing(tokens: int, weights, ids, names=("topk_weights", "topk_ids")) -> None:
    """The routing's metadata rules (shared by ``moe`` and ``QuantExperts``, each under its own
    argument ``names``): ``ids`` int32/int64 and ``weights`` floating point, both ``(tokens, top_k)``."""
    wname, iname = names
    if ids.dim() != 2 or ids.shape[0] != tokens or weights.shape != ids.shape:
        raise ValueError(f"{iname}, {wname}: expected equal (T={tokens}, top_k) shapes, got "
                         f"{tuple(ids.shape)} and {tuple(weights.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{iname}: expected int32 or int64 expert ids, got {ids.dtype}")
    if not weights.is_floating_point():
        raise TypeError(f"{wname}: expected floating point, got {weights.dtype}")


def check_moe_inputs(x, w13: PackedExperts, w2: PackedExperts, topk_weights, topk_ids) -> None:
    """``moe``'s rules (and ``moe_grouped``'s), each a ValueError/TypeError naming the argument, before
    anything runs. Metadata only (types, dtypes, shapes, devices): no tensor's values are read, so
    the check costs no host sync and runs under CUDA-graph capture."""
    if not isinstance(w13, PackedExperts) or not isinstance(w2, PackedExperts):
        raise TypeError(f"w13, w2: expected PackedExperts (mixed_gemm.prepack_experts), got "
                        f"{type(w13).__name__} and {type(w2).__name__}")
    for name, t in (("x", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a (T, H) tensor, got shape {tuple(x.shape)}")
    t, h = x.shape
    if not w13.gate_up:
        raise ValueError("w13: expected a gate|up stack, prepack_experts(..., gate_up=True) (gate and up rows "
                         f"interleaved in blocks of {GATE_UP_BLOCK}, the order the gated kernels read), got plain rows")
    if w2.gate_up:
        raise ValueError("w2: the down projection is stacked with plain rows (prepack_experts' gate_up=False)")
    for name, w in (("w13", w13), ("w2", w2)):
        _check_stack(name, w)
    inter = w13.n // 2
    if w13.k != h:
        raise ValueError(f"w13: expected K = H = {h} (x's last dimension), got K={w13.k}")
    if (w2.num_experts, w2.n, w2.k) != (w13.num_experts, h, inter):
        raise ValueError(f"w2: expected (E, H, I) = ({w13.num_experts}, {h}, {inter}) to match w13 and x, got "
                         f"({w2.num_experts}, {w2.n}, {w2.k})")
    kind13, kind2 = ((w.bits, w.zero_mode, w.layout) for w in (w13, w2))
    if kind13 != kind2:  # the grouped plan and the custom op compile one kind per layer
        raise ValueError(f"w2: expected the (bits, zero_mode, layout) of w13, {kind13}, got {kind2}")
    if w2.dtype != w13.dtype:
        raise TypeError(f"w2: dtype must equal w13's ({w13.dtype}), got {w2.dtype}")
    if x.dtype != w13.dtype:
        raise TypeError(f"x: dtype must equal the experts' ({w13.dtype}), got {x.dtype}")
    check_routing(t, topk_weights, topk_ids)
    for name, tensor in (("w13", w13.b), ("w2", w2.b), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if tensor.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (same as x), got {tensor.device}")


def _check_stack(name: str, w: PackedExperts) -> None:
    """A PackedExperts' own consistency: tensors, one device, one expert count."""
    tensors = [("b", w.b), ("scales", w.scales)] + ([] if w.zeros is None else [("zeros", w.zeros)])
    for field, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}.{field}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2 or t.shape[0] != w.b.shape[0] or t.device != w.b.device:
            raise ValueError(f"{name}.{field}: expected a stack of {w.b.shape[0]} experts on {w.b.device} like "
                             f"{name}.b, got shape {tuple(t.shape)} on {t.device}")
    if w.num_experts < 1:
        raise ValueError(f"{name}: expected at least one expert, got E=0")


def routing_stats(topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                  names=("topk_weights", "topk_ids")):
    """Each expert's pair count (a list), read on the host once (the per-expert path and the CPU):
    raises ``ValueError`` naming the argument (``names``: the caller's names of the two) where an
    id is neither in ``[0, E)`` nor ``-1`` (:data:`NO_EXPERT`) or where a routed pair's weight is NaN
    or infinite. ``-1`` pairs count for no expert. ``topk_ids`` must not be empty."""
    flat = topk_ids.reshape(-1)
    bad_weight = (~torch.isfinite(topk_weights.reshape(-1)) & (flat != NO_EXPERT)).any()
    # -1 goes to bin 0 and is dropped (so does anything below it, which raises below).
    counts = torch.bincount((flat + 1).clamp(0, num_experts), minlength=num_experts + 1)[1:]
    stats = torch.cat([flat.min().view(1), flat.max().view(1), bad_weight.view(1).to(flat.dtype),
                       counts.to(flat.dtype)]).tolist()
    lo, hi, bad = stats[:3]
    check_ids_range(lo, hi, num_experts, names[1])
    if bad:
        raise ValueError(f"{names[0]}: expected finite weights for the routed pairs ({names[1]} not -1), got nan/inf")
    return stats[3:]


def check_ids_range(lo: int, hi: int, num_experts: int, name: str = "topk_ids") -> None:
    """The routing rule where ids are read on the host: every id in ``[0, E)`` or ``-1``."""
    if lo < NO_EXPERT or hi >= num_experts:
        raise ValueError(f"{name}: expert ids must lie in [0, {num_experts}) (E) or be -1 (a pair that contributes "
                         f"nothing: an expert on another rank), got {lo if lo < NO_EXPERT else hi}")
