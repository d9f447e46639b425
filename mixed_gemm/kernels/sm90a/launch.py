"""Launching one sm90a config: a cached CUTLASS ``Params`` per (weight, bias, M bucket), built once
by the kernel library's host code and re-targeted per call.

A call with the same M as the slot's last one only patches the x and y TMA descriptors (in the
library, host-only) and launches; a new M in the bucket, or a moved split-K workspace, rebuilds the
Params (five ``cuTensorMapEncodeTiled`` and the scheduler state). Everything is host work or stream
work on the current stream, so calls are legal under CUDA-graph capture: the graph node owns a
copy of the Params, and stream-K / split-K barrier clears are captured as memset nodes.
"""
from __future__ import annotations

import threading

from ...runtime import workspace
from ...runtime.library import open_library
from ..base import sm_count
from . import abi, layout
from .config import Sm90aConfig


class Sm90aLaunchError(RuntimeError):
    """The kernel library refused a launch it was set up for (a bug, not bad input)."""


class Sm90aLauncher:
    """``launch(x, w, bias, y, m, stream, residual=None)`` for one config on one device (built once
    per (config, device) by selection). The CUTLASS epilogue reads no C operand: a residual is
    added by one elementwise kernel after it (M >= 33 only reaches this family on the H100)."""

    def __init__(self, config: Sm90aConfig, spec, device_index: int):
        self.config = config
        self.device_index = device_index
        (tm, tn, tk), (cm, cn) = config.tile, config.cluster
        self.lib, self.info = open_library(spec, abi.bind, abi.info, abi.ABI_VERSION,
                                           dict(tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=cm, cluster_n=cn,
                                                bits=config.bits, stages=config.stages), device_index, abi.describe)
        self.sms = sm_count(device_index)
        self.splits = config.launch_splits
        self.order = (config.swizzle, abi.RASTERS[config.raster])
        self.streamk = config.streamk
        self.lock = threading.Lock()
        # (weight tensors, bias pointer, M bucket) -> [slot handle, M, workspace pointer, its bytes]
        self._slots = {}

    def __del__(self):
        lib = getattr(self, "lib", None)
        for slot in getattr(self, "_slots", {}).values():
            lib.mg_destroy(slot[0])

    def _init(self, slot, x, w, bias_ptr, y, m, stream) -> None:
        b, s, z, n_pad, _ = w.parts[layout.NAME]
        args = (m, w.n, n_pad, w.k, w.group_size, self.sms, self.splits, *self.order)
        ws, ws_bytes = 0, 0
        if self.streamk:
            ws_bytes = self.lib.mg_workspace_bytes(*args)
            if ws_bytes:
                ws = workspace(self.device_index, stream, -(-ws_bytes // 4))
        rc = self.lib.mg_init(slot[0], b.data_ptr(), s.data_ptr(), z.data_ptr(), x.data_ptr(), y.data_ptr(),
                              bias_ptr or None, *args, ws or None, ws_bytes)
        if rc:
            raise Sm90aLaunchError(f"{self.config.name}: mg_init(M={m}, N={w.n}, K={w.k}, group={w.group_size}): "
                                   f"{abi.describe(rc)}")
        slot[1], slot[2], slot[3] = m, ws, ws_bytes

    def __call__(self, x, w, bias, y, m: int, stream: int, residual=None) -> None:
        bias_ptr = 0 if bias is None else bias.data_ptr()
        key = (w.parts[layout.NAME].key, bias_ptr, 1 << (m - 1).bit_length())
        with self.lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = [self.lib.mg_create(), -1, 0, 0]
            if slot[1] != m or (slot[3] and workspace(self.device_index, stream, -(-slot[3] // 4)) != slot[2]):
                self._init(slot, x, w, bias_ptr, y, m, stream)
            rc = self.lib.mg_run(slot[0], x.data_ptr(), y.data_ptr(), stream or None)
        if rc:
            raise Sm90aLaunchError(f"{self.config.name}: mg_run: {abi.describe(rc)}")
        if residual is not None:
            y.add_(residual)
