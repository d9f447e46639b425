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

    def __call__(self, x, w, bias, y, m: int, stream: int) -> None:
        config, dev, mode = self.config, self.device_index, self.mode
        grid = config.grid(m, w.n_pad)
        ws = sem = 0
        if mode == "serial" or mode == "fused":
            ws = workspace(dev, stream, m * w.n * (config.split_k if mode == "fused" else 1))
            sem = semaphores(dev, stream, grid[0] * grid[1])
        elif mode == "parallel":
            ws = workspace(dev, stream, config.split_k * m * w.n)
        gemm = self.gemm
        with gemm.lock:
            a = gemm.args
            a.a = x.data_ptr()
            a.b = w.b.data_ptr()
            a.scales = w.scales.data_ptr()
            a.zeros = 0 if w.zeros is None else w.zeros.data_ptr()
            a.bias = 0 if bias is None else bias.data_ptr()
            a.c = y.data_ptr()
            a.workspace = ws
            a.semaphores = sem
            a.m, a.n, a.k = m, w.n, w.k
            a.n_pad, a.k16 = w.n_pad, w.k16
            a.lda, a.ldc = w.k, w.n
            a.group_shift, a.num_groups = w.group_shift, w.num_groups
            a.split_mode = self.mode_id
            a.log_tile = self.log_tile
            gemm.launch(grid, stream)
        if mode == "parallel":
            reduce = self.reduce
            with reduce.lock:
                r = reduce.args
                r.workspace, r.bias, r.c = ws, 0 if bias is None else bias.data_ptr(), y.data_ptr()
                r.m, r.n, r.ldc, r.splits = m, w.n, w.n, config.split_k
                pairs = m * w.n // 2
                reduce.launch((min(max(1, -(-pairs // REDUCE_THREADS)), _REDUCE_MAX_BLOCKS), 1, 1), stream)
