"""Launching one moe_sm90s config: the routed rows sorted by expert on the device
(:class:`~mixed_gemm.kernels.moe_route.SortedGroupedLauncher`), gathered into expert order (TMA
reads a box of contiguous rows; a gather kernel, ``_g``, reads x's rows by index instead), one
grouped sm90s launch over them, and down's top-k sum (a pass of its own, or, ``_f``, in the down
GEMM's epilogue).

The descriptors are encoded once per (stacked weight, pairs) by the kernel library and re-targeted
per call (x, y and the routing's device arrays are plain pointers in the parameter block). The grid
is sized from the shapes alone (``ceil(pairs / TN) + E`` token-tile items; CTAs past the last tile
exit), or persistent (``_p``: a CTA per SM walking the items), so nothing is read on the host and
a call is capturable. Split-K partials come from the
per-stream workspace and the counters from the zeroed semaphores, as the dense family's.
"""
from __future__ import annotations

import threading

from ...runtime import semaphores, workspace
from ...runtime.library import open_library
from ..base import sm_count
from ..moe_route import LibraryRoutedLauncher
from . import abi
from .config import MoeSm90sConfig


class MoeSm90sLaunchError(RuntimeError):
    """The kernel library refused a launch it was set up for (a bug, not bad input)."""


class MoeSm90sLauncher(LibraryRoutedLauncher):
    """The grouped-family launcher (``launch(x, w, ids, weights, out, tokens, top_k, stream)``) of
    one config on one device (see ``moe_sm90a.launch`` for the interface)."""

    error = MoeSm90sLaunchError
    describe = staticmethod(abi.describe)
    down_by_index = False  # the combine's down reads sorted rows (a TMA box): h in pair order is gathered first

    def __init__(self, config: MoeSm90sConfig, spec, device_index: int):
        self.config = config
        self.stage = config.stage
        # gate|up reads x's rows by index (a_div = top-k): no gather pass; down adds the top-k sum.
        self.fused = config.gather or config.combine
        self.tile_rows = config.tile[1]  # the sort writes tile prefix sums for this height
        self.device_index = device_index
        tm, tn, tk = config.tile
        self.lib, self.info = open_library(spec, abi.bind, abi.info, abi.ABI_VERSION,
                                           dict(tile_m=tm, tile_n=tn, tile_k=tk, bits=config.bits,
                                                stages=config.pipeline_stages, smem_bytes=config.smem_bytes),
                                           device_index, abi.describe)
        self.ctas = sm_count(device_index) if config.persistent else 0  # a persistent grid: a CTA per SM
        self.lock = threading.Lock()
        self._slots = {}  # (stacked weight key, pairs) -> [slot handle, workspace floats, counters]

    def __del__(self):
        lib = getattr(self, "lib", None)
        for slot in getattr(self, "_slots", {}).values():
            lib.mg_destroy(slot[0])

    def gemm(self, rows, w, routing, out, stream: int, a_div: int = 0, y32=None, weights=None, top_k: int = 1) -> None:
        if bool(a_div) != self.config.gather or (y32 is not None) != self.config.combine:
            raise ValueError(f"{self.config.name}: a_div={a_div}, y32: a gather kernel (_g) reads x's rows by index "
                             "(a_div >= 1), the others the sorted rows (a_div 0); a combine (_f) adds the top-k sum "
                             "into y32, the others store out")
        pairs = routing.order.numel() if a_div else rows.shape[0]
        key = (w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr(), w.num_experts, w.n, w.k, pairs)
        with self.lock:
            slot = self._slots.get(key)
            if slot is None:
                handle = self.lib.mg_create()
                e = w.num_experts
                rc = self.lib.mg_init(handle, w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr(), rows.data_ptr(),
                                      pairs, w.n, w.scales.shape[-1], w.k, w.group_size, w.scales.shape[-2], e,
                                      w.b[0].numel() * w.b.element_size(), w.scales[0].numel() * w.scales.element_size(),
                                      int(self.stage == "w13"), self.config.splits, self.ctas)
                if rc:
                    self.lib.mg_destroy(handle)
                    self._fail(f"mg_init(pairs={pairs}, E={e}, N={w.n}, K={w.k}, group={w.group_size})", rc)
                slot = self._slots[key] = [handle, self.lib.mg_workspace_floats(handle), self.lib.mg_counters(handle)]
            ws = cnt = 0
            if slot[1]:
                ws = workspace(self.device_index, stream, slot[1])
                cnt = semaphores(self.device_index, stream, slot[2])
            rc = self.lib.mg_run(slot[0], rows.data_ptr(), out.data_ptr(), routing.offsets.data_ptr(),
                                 routing.counts.data_ptr(), routing.tile_ends_of(self.tile_rows).data_ptr(),
                                 routing.order.data_ptr(), a_div, y32.data_ptr() if y32 is not None else None,
                                 weights.data_ptr() if y32 is not None else None, top_k, ws or None, cnt or None,
                                 stream or None)
        self._fail("mg_run", rc)
