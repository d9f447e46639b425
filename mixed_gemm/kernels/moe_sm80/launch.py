"""Launching one moe_sm80 config: the routed rows sorted by expert on the device by the fatbin's
route kernels (:class:`~mixed_gemm.kernels.moe_route.SortedGroupedLauncher`), gathered by its
gather kernel unless the config is fused (then the tile reads them by index), one grouped launch of
the sm80 tile over every expert's rows (gate|up: its ``_gate_up`` kernel, which stores
SiLU(gate) * up), and down's combine kernel, unless fused (then the down epilogue adds the top-k
sum into an fp32 row per token, rounded once by one copy).

The grid is ``(ceil(pairs / BM) + E) x N tiles`` CTAs in one dimension: a bound from shapes alone.
The kernel finds each CTA's tile (bands of ``abi.BAND`` M tiles, M fastest) and expert in
``tile_ends`` (inclusive prefix sums of ``ceil(count_e / BM)``, written by the sort) and CTAs past
the last tile exit, so no count is read on the host (capturable).
"""
from __future__ import annotations

import ctypes

from ...runtime import get_module
from ..common import PER_CHANNEL_SHIFT
from ..moe_route import SORT_THREADS, SortArgs, SortedGroupedLauncher, gather_grid
from ..sm90a import layout as sm90a_layout
from .abi import ROUTE_THREADS, ROUTE_VEC, CombineArgs, GatherArgs, GroupedArgs
from .config import MoeSm80Config

_ROUTE_PER_CTA = ROUTE_THREADS * ROUTE_VEC  # columns of one route CTA


class MoeSm80Launcher(SortedGroupedLauncher):
    """The grouped-family launcher (``launch(x, w, ids, weights, out, tokens, top_k, stream)``) of
    one config on one device."""

    def __init__(self, config: MoeSm80Config, spec, device_index: int):
        module = get_module(spec, device_index)
        self.config = config
        self.stage = config.stage
        self.device_index = device_index
        self.fused = config.fused
        name = config.kernel_name
        self.gated = config.stage == "w13"
        self.grouped = module.function(name + ("_gate_up" if self.gated else ""), GroupedArgs, config.threads,
                                       config.smem_bytes)
        self.comb = module.function(name + "_combine", CombineArgs, ROUTE_THREADS)
        self.count = module.function(name + "_route_count", SortArgs, SORT_THREADS)
        self.scatter = module.function(name + "_route_scatter", SortArgs, SORT_THREADS)
        self.gath = module.function(name + "_gather", GatherArgs, SORT_THREADS)
        self.bm, self.bn = config.tile[0], config.tile[1]
        self.tile_rows = self.bm
        self._blocks = {}  # stacked weight key -> (argument block, its pointer array's address, N tiles)

    def _block(self, w):
        """The argument block of the stacked experts ``w``: the fields that depend on the weight."""
        key = (w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr(), w.num_experts, w.n, w.k, w.group_size)
        blk = self._blocks.get(key)
        if blk is None:
            args, argv = self.grouped.block()
            g = args.gemm
            n_pad, k16 = sm90a_layout.dims(w.b[0])
            g.b, g.scales, g.zeros = w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr()
            # gate|up writes h: SiLU(gate) * up, I = N / 2 columns
            g.n, g.k, g.n_pad, g.k16, g.lda, g.ldc = w.n, w.k, n_pad, k16, w.k, w.n // 2 if self.gated else w.n
            num_groups = w.scales.shape[1]
            g.group_shift = PER_CHANNEL_SHIFT if num_groups == 1 else w.group_size.bit_length() - 1
            g.num_groups = num_groups
            g.split_mode, g.log_tile = 0, 0
            args.b_stride = w.b[0].numel() * w.b.element_size()
            args.p_stride = w.scales[0].numel() * w.scales.element_size()
            args.experts = w.num_experts
            blk = self._blocks[key] = (args, argv, -(-n_pad // self.bn))
        return blk

    def sort_launch(self, args: SortArgs, blocks: int, stream: int) -> None:
        for fn in (self.count, self.scatter):
            with fn.lock:
                ctypes.memmove(ctypes.addressof(fn.args), ctypes.addressof(args), ctypes.sizeof(args))
                fn.launch((blocks, 1, 1), stream)

    def gather(self, x, order, div: int, out, stream: int) -> None:
        rows, cols = out.shape
        if rows == 0:
            return
        fn = self.gath
        with fn.lock:
            a = fn.args
            a.x, a.order, a.out, a.div, a.cols, a.rows = x.data_ptr(), order.data_ptr(), out.data_ptr(), div, cols, rows
            fn.launch(gather_grid(rows, cols), stream)

    def gemm(self, rows, w, routing, out, stream: int, a_div: int = 0, y32=None, weights=None, top_k: int = 1) -> None:
        args, argv, tiles_n = self._block(w)
        pairs = routing.order.shape[0]
        grid = ((-(-pairs // self.bm) + w.num_experts) * tiles_n, 1, 1)
        fn = self.grouped
        with fn.lock:
            args.gemm.a, args.gemm.c, args.gemm.m = rows.data_ptr(), out.data_ptr(), pairs
            args.offsets, args.counts = routing.offsets.data_ptr(), routing.counts.data_ptr()
            args.tile_ends = routing.tile_ends_of(self.bm).data_ptr()
            args.order, args.a_div, args.top_k = routing.order.data_ptr(), a_div, top_k
            args.y32 = y32.data_ptr() if y32 is not None else None
            args.weights = weights.data_ptr() if weights is not None else None
            fn.launch(grid, stream, argv)

    def combine(self, o, pos, weights, out, tokens: int, hidden: int, top_k: int, stream: int) -> None:
        fn = self.comb
        with fn.lock:
            a = fn.args
            a.o, a.pos, a.weights, a.y = o.data_ptr(), pos.data_ptr(), weights.data_ptr(), out.data_ptr()
            a.hidden, a.top_k = hidden, top_k
            fn.launch((tokens, -(-hidden // _ROUTE_PER_CTA), 1), stream)

