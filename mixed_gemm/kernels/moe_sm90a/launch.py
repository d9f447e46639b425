"""Launching one moe_sm90a config: the routed rows grouped by expert on the device
(:class:`~mixed_gemm.kernels.moe_route.SortedGroupedLauncher`: sort, gathers, the route kernels and
where everything rounds), one grouped GEMM over them through the family's host library.

The sort (two launches, templates/common/moe_sort.cuh), the row gather (one), the per-expert problem
sizes and pointers (one) and down's top-k sum (one, templates/common/moe_route.cuh) are the
library's kernels on the current stream. The gate|up GEMM's epilogue stores SiLU(gate) * up (the
library's GateUpEpilogue). TMA loads a box of contiguous rows, so x's rows are gathered into expert
order first (a fused gather would take TMA's gather4, sm_100 only, or a cp.async producer warp
group in place of the collective's TMA loads: docs/notes/moe.md).
"""
from __future__ import annotations

import ctypes
import threading

import torch

from ...runtime import workspace
from ...runtime.library import open_library
from ..base import sm_count
from ..moe_route import LibraryRoutedLauncher
from . import abi
from .config import MoeSm90aConfig


class MoeSm90aLaunchError(RuntimeError):
    """The kernel library refused a launch it was set up for (a bug, not bad input)."""


class _Arrays:
    """The per-expert device arrays that depend only on the stacked weight: its pointers and the
    (identical) strides, built on the device (fills, no host-to-device copy: capturable)."""

    __slots__ = ("w", "s", "z", "layouts_w", "strides_x", "strides_s", "strides_y")

    def __init__(self, lib, info: dict, w, device: torch.device):
        e = w.num_experts
        ar = torch.arange(e, dtype=torch.int64, device=device)
        self.w = ar * (w.b[0].numel() * w.b.element_size()) + w.b.data_ptr()
        self.s = ar * (w.scales[0].numel() * w.scales.element_size()) + w.scales.data_ptr()
        self.z = ar * (w.zeros[0].numel() * w.zeros.element_size()) + w.zeros.data_ptr()
        sizes = [info[f] for f in abi.STRIDE_FIELDS]
        blob = (ctypes.c_char * sum(sizes))()
        lib.mg_strides(blob, w.n, w.scales.shape[-1], w.k)
        raw, arrays, at = bytes(blob), [], 0
        for size in sizes:
            words = [int.from_bytes(raw[at + i:at + i + 4], "little", signed=True) for i in range(0, size, 4)]
            arr = torch.zeros((e, len(words)), dtype=torch.int32, device=device)
            for j, v in enumerate(words):
                if v:
                    arr[:, j] = v
            arrays.append(arr)
            at += size
        self.layouts_w, self.strides_x, self.strides_s, self.strides_y = arrays


class MoeSm90aLauncher(LibraryRoutedLauncher):
    """``launch(x, w, ids, weights, out, tokens, top_k, stream)`` for one config on one device,
    the interface of every grouped family (see ``moe_gemv.launch``): ``x`` the stage's rows (w13:
    ``(tokens, H)``; w2: ``h``, ``(tokens * top_k, I)`` in pair order), ``w`` the stacked experts
    (``ops.experts.PackedExperts``, sm90a layout, contiguous), ``ids`` ``(tokens, top_k)`` int32/int64,
    ``weights`` fp32 ``(tokens, top_k)`` (w2; None for w13), ``out`` ``h`` (w13, pair order) or ``y``."""

    error = MoeSm90aLaunchError
    describe = staticmethod(abi.describe)

    def __init__(self, config: MoeSm90aConfig, spec, device_index: int):
        self.config = config
        self.stage = config.stage
        self.raster_n = int(config.raster == "n")  # the group scheduler's walk: routed-row tiles first
        self.device_index = device_index
        tm, tn, tk = config.tile
        self.lib, self.info = open_library(spec, abi.bind, abi.info, abi.ABI_VERSION,
                                           dict(tile_m=tm, tile_n=tn, tile_k=tk, bits=config.bits,
                                                stages=config.stages, cluster_m=config.cluster), device_index, abi.describe)
        self.sms = sm_count(device_index)
        self.lock = threading.Lock()
        self._arrays = {}  # stacked weight key -> _Arrays
        self._ws_bytes = {}  # experts -> workspace bytes (tensormaps per SM)

    def _weight_arrays(self, w) -> _Arrays:
        key = (w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr(), w.num_experts, w.n, w.k)
        arrays = self._arrays.get(key)
        if arrays is None:
            with self.lock:
                arrays = self._arrays.get(key)
                if arrays is None:
                    arrays = self._arrays[key] = _Arrays(self.lib, self.info, w, w.b.device)
        return arrays

    def gemm(self, rows: torch.Tensor, w, routing, out: torch.Tensor, stream: int, a_div: int = 0, y32=None,
             weights=None, top_k: int = 1) -> None:
        """``out[r] = rows[r] W_e^T`` for the sorted rows ``[offsets[e], offsets[e] + counts[e])`` of
        each expert ``e`` (``routing``'s device tensors; rows past the last expert's are left as they
        are); gate|up: ``silu(gate) * up`` of it, ``out`` ``(rows, I)``. Rows are read in place
        (``a_div`` 0: TMA cannot gather) and ``y32`` is not taken (not fused)."""
        if a_div or y32 is not None:
            raise ValueError("a_div, y32: moe_sm90a reads its rows in sorted order and stores them (not fused)")
        arrays = self._weight_arrays(w)
        e = w.num_experts
        ptrs = torch.empty(4 * e, dtype=torch.int64, device=rows.device)  # ptr_x, ptr_y, then (N, T_e, K) int32
        ptr_x, ptr_y = ptrs[:e], ptrs[e:2 * e]
        shapes = ptrs[2 * e:].view(torch.int32)[:3 * e]
        rc = self.lib.mg_pointers(e, routing.counts.data_ptr(), routing.offsets.data_ptr(), shapes.data_ptr(), w.n, w.k,
                                  rows.data_ptr(), rows.shape[1] * rows.element_size(), out.data_ptr(),
                                  out.shape[1] * out.element_size(), ptr_x.data_ptr(), ptr_y.data_ptr(),
                                  stream or None)
        self._fail("the problem arrays", rc)
        ws_bytes = self._ws_bytes.get(e)
        if ws_bytes is None:
            ws_bytes = self._ws_bytes[e] = int(self.lib.mg_workspace_bytes(e, self.sms))
        ws = workspace(self.device_index, stream, -(-ws_bytes // 4)) if ws_bytes else 0
        rc = self.lib.mg_run(e, shapes.data_ptr(), arrays.w.data_ptr(), arrays.layouts_w.data_ptr(), ptr_x.data_ptr(),
                             arrays.strides_x.data_ptr(), arrays.s.data_ptr(), arrays.strides_s.data_ptr(),
                             arrays.z.data_ptr(), ptr_y.data_ptr(), arrays.strides_y.data_ptr(), w.group_size,
                             self.sms, ws or None, ws_bytes, int(self.stage == "w13"), self.raster_n, stream or None)
        if rc:  # (the message only on failure: no formatting per call)
            self._fail(f"mg_run(E={e}, N={w.n}, K={w.k}, group={w.group_size})", rc)
