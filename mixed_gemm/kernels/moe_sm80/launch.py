"""Launching one moe_sm80 config: the routed rows sorted and gathered by expert on the device
(:class:`~mixed_gemm.kernels.moe_route.SortedGroupedLauncher`), one grouped launch of the sm80 tile
over every expert's rows (gate|up: its ``_gate_up`` kernel, which stores SiLU(gate) * up), and
down's route kernel, all from the family's fatbin.

The grid is ``(ceil(pairs / BM) + E, N tiles)``: a bound from shapes alone. The kernel finds each
CTA's expert in ``tile_ends`` (inclusive prefix sums of ``ceil(count_e / BM)``, written here on the
device) and CTAs past the last tile exit, so no count is read on the host (capturable).
"""
from __future__ import annotations

import torch

from ...runtime import get_module
from ..common import PER_CHANNEL_SHIFT
from ..moe_route import SortedGroupedLauncher
from ..sm90a import layout as sm90a_layout
from .abi import ROUTE_THREADS, ROUTE_VEC, CombineArgs, GroupedArgs
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
        name = config.kernel_name
        self.gated = config.stage == "w13"
        self.grouped = module.function(name + ("_gate_up" if self.gated else ""), GroupedArgs, config.threads,
                                       config.smem_bytes)
        self.comb = module.function(name + "_combine", CombineArgs, ROUTE_THREADS)
        self.bm, self.bn = config.tile[0], config.tile[1]
        self._blocks = {}  # stacked weight key -> (argument block, its pointer array's address, grid y)

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

    def gemm(self, rows, w, counts, offsets, out, stream: int) -> None:
        args, argv, grid_y = self._block(w)
        tile_ends = torch.cumsum((counts + (self.bm - 1)) // self.bm, 0).to(torch.int32)
        grid = (-(-rows.shape[0] // self.bm) + w.num_experts, grid_y, 1)
        fn = self.grouped
        with fn.lock:
            args.gemm.a, args.gemm.c, args.gemm.m = rows.data_ptr(), out.data_ptr(), rows.shape[0]
            args.offsets, args.counts, args.tile_ends = offsets.data_ptr(), counts.data_ptr(), tile_ends.data_ptr()
            fn.launch(grid, stream, argv)

    def combine(self, o, pos, weights, out, tokens: int, hidden: int, top_k: int, stream: int) -> None:
        fn = self.comb
        with fn.lock:
            a = fn.args
            a.o, a.pos, a.weights, a.y = o.data_ptr(), pos.data_ptr(), weights.data_ptr(), out.data_ptr()
            a.hidden, a.top_k = hidden, top_k
            fn.launch((tokens, -(-hidden // _ROUTE_PER_CTA), 1), stream)
