"""Launching one gemv config: the argument block filled once per weight, the call's tensors, and
the split-K planes and arrival counters from the per-stream workspaces."""
from __future__ import annotations

from ...runtime import get_module, semaphores, workspace
from .abi import GemvArgs
from .config import GemvConfig


class GemvLauncher:
    """``launch(x, w, bias, y, m, stream, residual=None)`` for one config on one device (the
    residual is added in the kernel's epilogue)."""

    def __init__(self, config: GemvConfig, spec, device_index: int):
        module = get_module(spec, device_index)
        self.config = config
        self.device_index = device_index
        # Static shared memory (below the 48 KB default limit), or dynamic (opt-in above it): a ring's
        # (sized per launch by M and the group size), or x stages above 48 KB (config.smem_bytes).
        self.fn = module.function(config.kernel_name, GemvArgs, config.threads,
                                  config.smem_bytes if config.dynamic_smem else 0)
        self.layout = config.layout
        # the weight's view key (of the layout read) -> (argument block, argv, grid, splits, ring smem by M or None)
        self._blocks = {}

    def _block(self, w):
        args, argv = self.fn.block()
        row_tiles, splits, smem = fill_weight(args, self.config, w)
        blk = self._blocks[w.parts[self.layout].key] = (args, argv, (row_tiles, splits, 1), splits, smem)
        return blk

    def __call__(self, x, w, bias, y, m: int, stream: int, residual=None) -> None:
        blk = self._blocks.get(w.parts[self.layout].key)
        if blk is None:
            blk = self._block(w)
        a, argv, grid, splits, smem = blk
        ws = cnt = 0
        if splits > 1:
            ws = workspace(self.device_index, stream, splits * m * w.n)
            cnt = semaphores(self.device_index, stream, grid[0])
        fn = self.fn
        with fn.lock:
            a.x = x.data_ptr()
            a.bias = 0 if bias is None else bias.data_ptr()
            a.residual = 0 if residual is None else residual.data_ptr()
            a.y = y.data_ptr()
            a.workspace, a.counters, a.m = ws, cnt, m
            fn.launch(grid, stream, argv, smem[m] if smem else None)


def fill_weight(args: GemvArgs, config: GemvConfig, w):
    """Fill ``args``' weight fields for ``w`` (its ``config.layout`` view); returns ``(row tiles,
    splits, smem)``: the grid and, with a ring, each M's dynamic shared memory (index m: 1..tokens;
    it depends on M and the groups), else None. The GEMM-fused all-reduce fills its block the same."""
    view = w.parts[config.layout]
    row_tiles, splits, chunk, strips = config.launch_geometry(w.n, w.k)
    args.b, args.scales = view.b.data_ptr(), view.scales.data_ptr()
    args.zeros = 0 if view.zeros is None else view.zeros.data_ptr()  # sm80 symmetric: none
    args.n, args.k, args.strips, args.katoms = w.n, w.k, strips, w.k16
    args.group_shift, args.num_groups = w.group_shift, w.num_groups
    args.splits, args.chunk = splits, chunk
    smem = None
    if config.stages:
        smem = [0] + [config.ring_smem_bytes(m, 1 << w.group_shift) for m in range(1, config.tokens + 1)]
        for name, t in (("scales", view.scales), ("zeros", view.zeros)):
            if t is None or t.data_ptr() % 16:  # its rows are copied in 16-byte chunks
                raise ValueError(f"{config.schedule}: the weight's {name} must be 16-byte aligned and present")
    return row_tiles, splits, smem
