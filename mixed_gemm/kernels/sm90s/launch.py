"""Launching one sm90s config: a parameter block (TMA descriptors) per (weight, M bucket), encoded
once by the kernel library and re-targeted per call.

A call with the slot's last M only re-points the x descriptor (host-only, when x moved) and
launches; another M re-encodes the descriptors. The split-K partials come from the per-stream
workspace and the tile counters from the zeroed semaphores (the kernel leaves them at zero), so
a launch is one kernel node under CUDA-graph capture: no memset, no host sync, no allocation
after the first call of a size.
"""
from __future__ import annotations

import threading

from ...runtime import semaphores, workspace
from ...runtime.driver import primary_context
from ...runtime.library import open_library
from ..base import sm_count
from ..sm90a import layout
from . import abi
from .config import Sm90sConfig


class Sm90sLaunchError(RuntimeError):
    """The kernel library refused a launch it was set up for (a bug, not bad input)."""


class Sm90sLauncher:
    """``launch(x, w, bias, y, m, stream, residual=None)`` for one config on one device; the bias
    and the residual are added in the epilogue."""

    def __init__(self, config: Sm90sConfig, spec, device_index: int):
        self.config = config
        self.device_index = device_index
        tm, tn, tk = config.tile
        self.lib, self.info = open_library(spec, abi.bind, abi.info, abi.ABI_VERSION,
                                           dict(tile_m=tm, tile_n=tn, tile_k=tk, bits=config.bits,
                                                stages=config.pipeline_stages, ctas_per_sm=config.ctas_per_sm,
                                                cluster_m=config.cluster[0], phased=int(config.phased),
                                                cluster_k=config.cluster[1],
                                                smem_bytes=config.smem_bytes), device_index, abi.describe)
        self.sms = sm_count(device_index)
        # The CTAs of one wave: for a cluster kernel, the clusters that fit the GPCs at once, x C x S.
        self.slots = self.sms * config.ctas_per_sm
        if config.cluster != (1, 1):
            with primary_context(device_index):
                clusters = self.lib.mg_max_active_clusters()
            if clusters < 0:
                raise Sm90sLaunchError(f"{config.name}: mg_max_active_clusters: {abi.describe(clusters)}")
            self.slots = clusters * config.cluster[0] * config.cluster[1]
        self.lock = threading.Lock()
        # (weight view key, M bucket) -> [slot handle, M, workspace floats, split-K counters]
        self._slots = {}

    def __del__(self):
        lib = getattr(self, "lib", None)
        for slot in getattr(self, "_slots", {}).values():
            lib.mg_destroy(slot[0])

    def _init(self, slot, x, w, m) -> None:
        view = w.parts[layout.NAME]
        splits = self.config.launch_splits(m, w.n, w.k, self.sms, self.slots)
        sk_ctas = self.slots if self.config.decomposition == "sk" else 0  # stream-K: one wave of CTAs
        rc = self.lib.mg_init(slot[0], view.b.data_ptr(), view.scales.data_ptr(), view.zeros.data_ptr(), x.data_ptr(),
                              m, w.n, view.n_pad, w.k, w.group_size, w.num_groups, splits, sk_ctas)
        if rc:
            raise Sm90sLaunchError(f"{self.config.name}: mg_init(M={m}, N={w.n}, K={w.k}, group={w.group_size}, "
                                   f"splits={splits}, sk_ctas={sk_ctas}): {abi.describe(rc)}")
        slot[1], slot[2], slot[3] = m, self.lib.mg_workspace_floats(slot[0]), self.lib.mg_counters(slot[0])

    def __call__(self, x, w, bias, y, m: int, stream: int, residual=None) -> None:
        key = (w.parts[layout.NAME].key, 1 << (m - 1).bit_length())
        with self.lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = [self.lib.mg_create(), -1, 0, 0]
            if slot[1] != m:
                self._init(slot, x, w, m)
            ws = cnt = 0
            if slot[2]:
                ws = workspace(self.device_index, stream, slot[2])
                cnt = semaphores(self.device_index, stream, slot[3])
            rc = self.lib.mg_run(slot[0], x.data_ptr(), y.data_ptr(), None if bias is None else bias.data_ptr(),
                                 None if residual is None else residual.data_ptr(), ws or None, cnt or None,
                                 stream or None)
        if rc:
            raise Sm90sLaunchError(f"{self.config.name}: mg_run: {abi.describe(rc)}")
