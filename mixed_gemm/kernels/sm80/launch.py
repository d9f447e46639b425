"""Launching one sm80 config: the argument block filled from the weight and the call's tensors,
split-K scratch from the per-stream workspaces, and the reduce kernel for parallel split-K."""
from __future__ import annotations

from ...runtime import get_module, semaphores, workspace
from ..common import REDUCE_THREADS, SPLIT_K_MODES
from .abi import GemmArgs, ReduceArgs
from ..gemv import lowbit_layout
from ..sm90a import layout as sm90a_layout
from . import layout as sm80_layout
from .config import Sm80Config

_DIMS = {sm80_layout.NAME: sm80_layout.dims, sm90a_layout.NAME: sm90a_layout.dims,
         lowbit_layout.NAME: lowbit_layout.dims}  # b -> (N_pad, K16)

_REDUCE_MAX_BLOCKS = 4096  # grid-stride loop beyond this: enough blocks to fill any GPU


class Sm80Launcher:
    """``launch(x, w, bias, y, m, stream, residual=None)`` for one config on one device (the
    residual is added in the epilogue, or in the reduce kernel of parallel split-K). Built once per
    (config, device) by selection; a call fills the argument block and launches."""

    def __init__(self, config: Sm80Config, spec, device_index: int):
        module = get_module(spec, device_index)
        self.config = config
        self.device_index = device_index
        self.gemm = module.function(config.kernel_name, GemmArgs, config.threads, config.smem_bytes)
        self.reduce = module.function(config.kernel_name + "_reduce", ReduceArgs, REDUCE_THREADS)
        self.mode = config.split_k_mode if config.split_k > 1 else "none"
        self.mode_id = SPLIT_K_MODES[self.mode]
        self.log_tile = config.swizzle.bit_length() - 1
        self.bm, self.swizzle = config.tile[0], config.swizzle
        self.layout = config.layout
        self._dims = _DIMS[config.layout]
        self._blocks = {}  # the weight's view key (of the layout read) -> (argument block, its pointer array's address, grid y, grid z)

    def _block(self, w):
        """The argument block of weight ``w``: every field that depends only on the weight is
        filled once, so a call writes just x, y, bias, M and the split-K scratch."""
        view = w.parts[self.layout]
        args, argv = self.gemm.block()
        n_pad, k16 = self._dims(view.b)
        args.b, args.scales = view.b.data_ptr(), view.scales.data_ptr()
        args.zeros = 0 if view.zeros is None else view.zeros.data_ptr()
        args.n, args.k, args.n_pad, args.k16, args.lda, args.ldc = w.n, w.k, n_pad, k16, w.k, w.n
        args.group_shift, args.num_groups = w.group_shift, w.num_groups
        args.split_mode, args.log_tile = self.mode_id, self.log_tile
        # The grid's y (column-tile groups) and z (slices) depend on the weight only; x depends on M.
        _, grid_y, grid_z = self.config.grid(1, n_pad)
        blk = self._blocks[view.key] = (args, argv, grid_y, grid_z)
        return blk

    def __call__(self, x, w, bias, y, m: int, stream: int, residual=None) -> None:
        config, dev, mode = self.config, self.device_index, self.mode
        blk = self._blocks.get(w.parts[self.layout].key)
        if blk is None:
            blk = self._block(w)
        a, argv, grid_y, grid_z = blk
        grid = (-(-m // self.bm) * self.swizzle, grid_y, grid_z)  # as Sm80Config.grid
        ws = sem = 0
        if mode == "serial" or mode == "fused":
            ws = workspace(dev, stream, m * w.n * (config.split_k if mode == "fused" else 1))
            sem = semaphores(dev, stream, grid[0] * grid[1])
        elif mode == "parallel":
            ws = workspace(dev, stream, config.split_k * m * w.n)
        gemm = self.gemm
        with gemm.lock:
            a.a = x.data_ptr()
            a.bias = 0 if bias is None else bias.data_ptr()
            a.residual = 0 if residual is None else residual.data_ptr()  # parallel: read by the reduce
            a.c = y.data_ptr()
            a.workspace = ws
            a.semaphores = sem
            a.m = m
            gemm.launch(grid, stream, argv)
        if mode == "parallel":
            reduce = self.reduce
            with reduce.lock:
                r = reduce.args
                r.workspace, r.bias, r.c = ws, 0 if bias is None else bias.data_ptr(), y.data_ptr()
                r.residual = 0 if residual is None else residual.data_ptr()
                r.m, r.n, r.ldc, r.splits = m, w.n, w.n, config.split_k
                pairs = m * w.n // 2
                reduce.launch((min(max(1, -(-pairs // REDUCE_THREADS)), _REDUCE_MAX_BLOCKS), 1, 1), stream)
