"""Launching one sm80 config: the argument block filled from the weight and the call's tensors,
split-K scratch from the per-stream workspaces, and the reduce kernel for parallel split-K."""
from __future__ import annotations

from ...runtime import get_module, semaphores, workspace
from ..common import REDUCE_THREADS, SPLIT_K_MODES
from .abi import GemmArgs, ReduceArgs
from .config import Sm80Config

_REDUCE_MAX_BLOCKS = 4096  # grid-stride loop beyond this: enough blocks to fill any GPU


class Sm80Launcher:
    """``launch(x, w, bias, y, m, stream)`` for one config on one device. Built once per
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
        self._blocks = {}  # weight launch_key -> (argument block, its pointer array's address, grid y, grid z)

    def _block(self, w):
        """The argument block of weight ``w``: every field that depends only on the weight is
        filled once, so a call writes just x, y, bias, M and the split-K scratch."""
        args, argv = self.gemm.block()
        b_ptr, s_ptr, z_ptr, n, k, n_pad, k16, group_shift, num_groups = w.launch_key
        args.b, args.scales, args.zeros = b_ptr, s_ptr, z_ptr
        args.n, args.k, args.n_pad, args.k16, args.lda, args.ldc = n, k, n_pad, k16, k, n
        args.group_shift, args.num_groups = group_shift, num_groups
        args.split_mode, args.log_tile = self.mode_id, self.log_tile
        # The grid's y (column-tile groups) and z (slices) depend on the weight only; x depends on M.
        _, grid_y, grid_z = self.config.grid(1, n_pad)
        blk = self._blocks[w.launch_key] = (args, argv, grid_y, grid_z)
        return blk

    def __call__(self, x, w, bias, y, m: int, stream: int) -> None:
        config, dev, mode = self.config, self.device_index, self.mode
        blk = self._blocks.get(w.launch_key)
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
                r.m, r.n, r.ldc, r.splits = m, w.n, w.n, config.split_k
                pairs = m * w.n // 2
                reduce.launch((min(max(1, -(-pairs // REDUCE_THREADS)), _REDUCE_MAX_BLOCKS), 1, 1), stream)
