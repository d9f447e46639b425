"""What the grouped tile families (moe_sm90a, moe_sm80) do around their one GEMM launch per
projection: sort the (token, slot) pairs by expert on the device (:class:`Routing`, two launches of
the family's route kernels, templates/common/moe_sort.cuh: a stable counting sort), gather their
rows where the GEMM cannot read them by index, and finish the down projection with the one-pass
route kernel (templates/common/moe_route.cuh), the top-k weighted sum, unless the GEMM adds it
itself (moe_sm80's fused configs). The gate|up GEMM forms SiLU(gate) * up in its own epilogue (the
gate|up stack's interleaved rows, templates/common/gate_up.cuh) and writes only ``h``.

Nothing here reads a tensor's values on the host: an expert's row count lives only in device
tensors, so a call is legal under CUDA-graph capture. Rows and rounding: the routed rows are sorted
by expert (stable; pairs whose id lies outside ``[0, E)`` sort last and are never computed),
gathered and multiplied (fp32 accumulation); gate|up rounds ``g`` and ``u`` to the activation dtype,
forms ``silu(g) * u`` in fp32 and rounds once; down's output rows are rounded once, and its route
kernel scatters each pair's row back, multiplies it by its fp32 top-k weight and adds a token's
slots in fp32 (a fixed order: deterministic), rounding ``y`` once. A fused down (moe_sm80) adds
the weighted fp32 accumulators into a token's fp32 row with atomics (no rounding of the pair's row;
order-dependent in the last fp32 bits for top-k > 2) and rounds ``y`` once.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

SORT_THREADS = 512      # mixed_gemm::moe_sort::kThreads (templates/common/moe_sort.cuh)
SORT_MAX_EXPERTS = 511  # moe_sort::kMaxExperts: keys 0..E in one CTA's scan
MAX_TILE_HEIGHTS = 2    # moe_sort::kMaxTileRows
SORT_BLOCKS = 32        # the scatter CTAs each read every CTA's histogram: keep them few
GATHER_VEC = 8          # activations per 16-byte vector of the gather
GATHER_UNROLL = 4       # moe_sort::kGatherUnroll: vectors a gather thread loads before it stores

_p, _i = ctypes.c_void_p, ctypes.c_int


class SortArgs(ctypes.Structure):
    """mixed_gemm::moe_sort::SortArgs."""

    _fields_ = [("ids", _p), ("hist", _p), ("order", _p), ("pos", _p), ("counts", _p), ("offsets", _p),
                ("tile_ends", _p), ("pairs", _i), ("experts", _i), ("ids_64", _i), ("chunk", _i),
                ("tile_heights", _i), ("tile_rows", _i * MAX_TILE_HEIGHTS)]


SORT_ARGS_BYTES = ctypes.sizeof(SortArgs)


def sort_geometry(pairs: int) -> Tuple[int, int]:
    """``(chunk, blocks)`` of the sort's two launches for ``pairs`` pairs: each CTA takes ``chunk``
    pairs (a multiple of :data:`SORT_THREADS`, so that a pass gives each thread one), at most
    :data:`SORT_BLOCKS` CTAs (each scatter CTA reads ``blocks x (E + 1)`` histogram counts)."""
    passes = max(1, -(-pairs // (SORT_THREADS * SORT_BLOCKS)))
    chunk = SORT_THREADS * passes
    return chunk, max(1, -(-pairs // chunk))


def gather_grid(rows: int, cols: int) -> Tuple[int, int, int]:
    """The row gather's grid for ``rows`` rows of ``cols`` activations (``moe_sort::gather_grid``):
    a CTA copies ``rows_per_cta`` rows x ``span`` 16-byte vectors of a row."""
    per_cta = SORT_THREADS * GATHER_UNROLL
    span = min(cols // GATHER_VEC, per_cta)
    rows_per_cta = per_cta // span
    return -(-rows // rows_per_cta), -(-(cols // GATHER_VEC) // span), 1


@dataclass
class Routing:
    """The pairs sorted by expert, as the route kernels write them (device tensors):
    ``order`` int32 ``(pairs,)`` sorted row -> pair (a permutation: the pairs of no expert last);
    ``pos`` int32 ``(pairs,)`` pair -> sorted row, -1 for a pair no expert computes;
    ``counts``, ``offsets`` int64 ``(E,)`` each expert's rows and its first sorted row;
    ``tile_ends`` int32 ``(len(tile_rows), E)``: row i the inclusive prefix sums of
    ``ceil(counts / tile_rows[i])`` (moe_sm80's tile -> expert map), or None."""

    order: torch.Tensor
    pos: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    tile_ends: Optional[torch.Tensor] = None
    tile_rows: Tuple[int, ...] = ()

    def tile_ends_of(self, rows: int) -> torch.Tensor:
        """The tile prefix sums for tiles of ``rows`` rows (KeyError-free: a ValueError if absent)."""
        if rows not in self.tile_rows:
            raise ValueError(f"tile_rows: this routing has tile prefix sums for {self.tile_rows}, not {rows}")
        return self.tile_ends[self.tile_rows.index(rows)]


def tile_heights(*heights: Optional[int]) -> Tuple[int, ...]:
    """The distinct tile heights (None dropped) a shared routing writes prefix sums for."""
    out = tuple(dict.fromkeys(h for h in heights if h))
    if len(out) > MAX_TILE_HEIGHTS:
        raise ValueError(f"tile_rows: at most {MAX_TILE_HEIGHTS} tile heights per routing, got {out}")
    return out


def reference_routing(ids: torch.Tensor, experts: int, tile_rows: Sequence[int] = ()) -> Routing:
    """What the route kernels compute, from torch operations on any device (CPU tests; the GPU
    tests compare the kernels' outputs with it): a stable sort of the keys (the id in ``[0, E)``,
    else ``E``)."""
    flat = ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < experts)
    key = torch.where(valid, flat, experts)
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=experts + 1)[:experts]
    offsets = torch.cumsum(counts, 0) - counts
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=order.device)
    pos = torch.where(valid, pos, -1)
    tile_rows = tuple(tile_rows)
    ends = None
    if tile_rows:
        ends = torch.stack([torch.cumsum((counts + r - 1) // r, 0) for r in tile_rows]).int()
    return Routing(order.int(), pos.int(), counts, offsets, ends, tile_rows)


MAX_PAIRS = 2**31 - 1  # sorted rows are 32-bit indices in the kernels


def sort_limits(pairs: int, experts: int, why_pairs: str = "32-bit row indices"):
    """(ok, reason) for a routing the device sort and 32-bit row indices take: at most MAX_PAIRS
    pairs and SORT_MAX_EXPERTS experts (the grouped families' shared rule)."""
    if pairs > MAX_PAIRS:
        return False, f"at most {MAX_PAIRS} (token, slot) pairs ({why_pairs}), got {pairs}"
    if experts > SORT_MAX_EXPERTS:
        return False, f"at most {SORT_MAX_EXPERTS} experts (the routing sort's one-CTA scan), got {experts}"
    return True, ""


class SortedGroupedLauncher:
    """The launcher interface of every grouped family (see ``moe_gemv.launch``) for families whose
    kernel computes each expert's contiguous block of sorted rows. Subclasses provide ``stage``
    (``"w13"`` or ``"w2"``), ``tile_rows`` (the height of the row tiles whose prefix sums the GEMM
    reads, or None), and the device calls :meth:`sort_launch`, :meth:`gather`, :meth:`gemm` and
    :meth:`combine`; a fused one (``fused``) reads its rows by index and adds the top-k sum itself
    (:meth:`gemm`'s ``a_div`` and ``y32``)."""

    stage = "w13"
    tile_rows: Optional[int] = None
    fused = False
    # A fused down reads h's rows by index (a_div 1) where h is in pair order; else (moe_sm90s's
    # combine: TMA boxes of sorted rows) h is gathered into sorted order first.
    down_by_index = True
    # The two stages can hand h over in their own sorted row order (see __call__'s sorted_h).
    sorted_pairs = True

    def sort_launch(self, args: SortArgs, blocks: int, stream: int) -> None:
        """The two route kernels (count, then scatter) over ``blocks`` CTAs with ``args``."""
        raise NotImplementedError

    def gather(self, x: torch.Tensor, order: torch.Tensor, div: int, out: torch.Tensor, stream: int) -> None:
        """``out[r] = x[order[r] / div]`` for every row of ``out``."""
        raise NotImplementedError

    def gemm(self, rows: torch.Tensor, w, routing: Routing, out: torch.Tensor, stream: int, a_div: int = 0,
             y32: Optional[torch.Tensor] = None, weights: Optional[torch.Tensor] = None, top_k: int = 1) -> None:
        """``out[r] = A_r W_e^T`` for the sorted rows ``[offsets[e], offsets[e] + counts[e])`` of each
        expert ``e`` (rows past the last expert's are left as they are), ``A_r`` row ``r`` of ``rows``
        (``a_div`` 0) or row ``order[r] / a_div`` (fused families); the gate|up stage writes
        ``silu(gate) * up`` of that product instead (``out`` ``(rows, I)``). ``y32`` (fused down):
        instead of ``out``, adds ``weights[p] * A_r W_e^T`` into ``y32[p / top_k]`` (p = order[r])."""
        raise NotImplementedError

    def combine(self, o, pos, weights, out, tokens: int, hidden: int, top_k: int, stream: int) -> None:
        """``out[t] = sum_j weights[t, j] * o[pos[t k + j]]`` (slots with ``pos < 0`` add nothing)."""
        raise NotImplementedError

    def route(self, ids: torch.Tensor, experts: int, tile_rows: Sequence[int], stream: int) -> Routing:
        """The pairs of ``ids`` sorted by expert on the device (:class:`Routing`, with tile prefix
        sums for each of ``tile_rows``): two launches, no host read."""
        flat = ids.reshape(-1)
        pairs = flat.numel()
        tile_rows = tuple(tile_rows)
        dev = ids.device
        chunk, blocks = sort_geometry(pairs)
        i32 = dict(dtype=torch.int32, device=dev)
        ws = torch.empty(pairs * 2 + blocks * (experts + 1) + len(tile_rows) * experts, **i32)
        order, pos = ws[:pairs], ws[pairs:2 * pairs]
        hist = ws[2 * pairs:2 * pairs + blocks * (experts + 1)]
        ends = ws[2 * pairs + blocks * (experts + 1):].view(len(tile_rows), experts) if tile_rows else None
        per_expert = torch.empty(2, experts, dtype=torch.int64, device=dev)
        args = SortArgs()
        args.ids, args.hist, args.order, args.pos = flat.data_ptr(), hist.data_ptr(), order.data_ptr(), pos.data_ptr()
        args.counts, args.offsets = per_expert[0].data_ptr(), per_expert[1].data_ptr()
        args.tile_ends = ends.data_ptr() if ends is not None else None
        args.pairs, args.experts, args.ids_64, args.chunk = pairs, experts, int(flat.dtype == torch.int64), chunk
        args.tile_heights = len(tile_rows)
        for i, r in enumerate(tile_rows):
            args.tile_rows[i] = r
        self.sort_launch(args, blocks, stream)
        return Routing(order, pos, per_expert[0], per_expert[1], ends, tile_rows)

    def __call__(self, x: torch.Tensor, w, ids: torch.Tensor, weights, out: torch.Tensor, tokens: int, top_k: int,
                 stream: int, sorted_h: bool = False, routing: Optional[Routing] = None) -> None:
        """One stage: ``x`` the stage's rows (w13: ``(tokens, H)``; w2: ``h``, ``(tokens * top_k, I)``),
        ``w`` the stacked experts, ``ids`` ``(tokens, top_k)``, ``weights`` fp32 ``(tokens, top_k)``
        (w2; None for w13), ``out`` ``h`` (w13) or ``y``. ``sorted_h`` (both stages, same ids): ``h``
        stays in the sorted pair order the GEMMs use (gate|up writes it so, down reads it so)
        instead of pair order, saving a scatter and a gather of ``h``; the sort is stable, so both
        stages sort alike. ``routing``: the pairs already sorted for these ids (:meth:`route`, with
        this launcher's ``tile_rows``), shared by the two stages; else sorted here."""
        pairs = tokens * top_k
        if pairs == 0:
            return
        if routing is None:
            routing = self.route(ids, w.num_experts, tile_heights(self.tile_rows), stream)
        order = routing.order
        if self.stage == "w13":
            if self.fused:
                rows, a_div = x, top_k
            else:
                rows, a_div = torch.empty((pairs, x.shape[1]), dtype=x.dtype, device=x.device), 0
                self.gather(x, order, top_k, rows, stream)
            if sorted_h:  # rows past the experts' (out-of-range ids) stay unwritten: down never reads them
                self.gemm(rows, w, routing, out, stream, a_div=a_div)
            else:  # pair order: an out-of-range pair's row is 0
                hs = torch.zeros_like(out)
                self.gemm(rows, w, routing, hs, stream, a_div=a_div)
                out.index_copy_(0, order.long(), hs)
        elif self.fused:
            # h rows by index (pair order) or in place (sorted); the top-k sum in the GEMM's epilogue.
            y32 = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
            rows, a_div = x, 0 if sorted_h else 1
            if a_div and not self.down_by_index:
                rows, a_div = torch.empty_like(x), 0
                self.gather(x, order, 1, rows, stream)
            self.gemm(rows, w, routing, out, stream, a_div=a_div, y32=y32, weights=weights, top_k=top_k)
            out.copy_(y32)
        else:
            if sorted_h:
                rows = x
            else:
                rows = torch.empty_like(x)
                self.gather(x, order, 1, rows, stream)
            o = torch.empty((pairs, w.n), dtype=x.dtype, device=x.device)
            self.gemm(rows, w, routing, o, stream)
            self.combine(o, routing.pos, weights, out, tokens, w.n, top_k, stream)


class LibraryRoutedLauncher(SortedGroupedLauncher):
    """A :class:`SortedGroupedLauncher` whose family's host library (``self.lib``, opened by the
    subclass) exports the route kernels with one C ABI: ``mg_route`` (the sort), ``mg_gather`` and
    ``mg_combine`` (templates/common/moe_route.cuh). Subclasses set ``error`` (the exception a refused
    launch raises: a bug, not bad input) and ``describe`` (their ABI's return-code text)."""

    error = RuntimeError
    describe = staticmethod(str)

    def _fail(self, what: str, rc: int) -> None:
        if rc:
            raise self.error(f"{self.config.name}: {what}: {self.describe(rc)}")

    def sort_launch(self, args: SortArgs, blocks: int, stream: int) -> None:
        self._fail("the routing sort", self.lib.mg_route(ctypes.addressof(args), blocks, stream or None))

    def gather(self, x, order, div: int, out, stream: int) -> None:
        self._fail("the row gather", self.lib.mg_gather(x.data_ptr(), order.data_ptr(), div, out.data_ptr(),
                                                         out.shape[0], out.shape[1], stream or None))

    def combine(self, o, pos, weights, out, tokens: int, hidden: int, top_k: int, stream: int) -> None:
        self._fail("the down epilogue", self.lib.mg_combine(o.data_ptr(), pos.data_ptr(), weights.data_ptr(),
                                                             out.data_ptr(), tokens, hidden, top_k, stream or None))
