"""The C ABI of an sm90s kernel library (``templates/sm90s/kernel.cu.j2``), for ctypes.

One shared library per kernel: the device code, the host code that encodes the TMA descriptors
(``cuTensorMapEncodeTiled``) into a cached parameter block, and the launch. ``ABI_VERSION`` is
rendered into the source and reported back by ``mg_info``; the launcher refuses another version.
"""
from __future__ import annotations

import ctypes

from ...runtime.library import signature_binder

ABI_VERSION = 4
# mg_info's fields, in order.
INFO_FIELDS = ("abi", "params_bytes", "smem_bytes", "threads", "stages", "bits", "tile_m", "tile_n", "tile_k",
               "ctas_per_sm", "cluster_m", "phased", "cluster_k")
# Negative return codes of mg_init / mg_run / mg_prepare / mg_max_active_clusters (templates/sm90s/host.cuh).
ERRORS = {-1: "driver entry points (cuTensorMapEncodeTiled / cuTensorMapReplaceAddress) unavailable",
          -2: "encoding the weight descriptor failed", -3: "encoding the scales descriptor failed",
          -4: "encoding the zeros descriptor failed",
          -5: "encoding the x descriptor failed (x must be 16-byte aligned, K a multiple of 8)",
          -6: "re-targeting the x descriptor failed",
          -7: "cudaFuncSetAttribute or cudaOccupancyMaxActiveClusters failed",
          -8: "cudaLaunchKernelExC failed", -9: "loading the embedded fatbin (cudaLibraryLoadData) failed",
          -10: "a shape the kernel cannot take (M, N, K, N_pad, group size, splits, or stream-K with a cluster or phase offset)"}

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES = {
    "mg_info": (_I, [ctypes.POINTER(_LL), _I]),
    "mg_create": (_P, []),
    "mg_destroy": (None, [_P]),
    "mg_prepare": (_I, []),
    "mg_max_active_clusters": (_I, []),
    "mg_init": (_I, [_P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I]),
    "mg_workspace_floats": (_LL, [_P]),
    "mg_counters": (_LL, [_P]),
    "mg_splits": (_I, [_P]),
    "mg_run": (_I, [_P, _P, _P, _P, _P, _P, _P, _P]),
}


bind = signature_binder(SIGNATURES)  # sets restype/argtypes of every function of a loaded library


def describe(rc: int) -> str:
    """Text of a return code of mg_init / mg_run / mg_prepare / mg_max_active_clusters."""
    return ERRORS.get(rc, f"error {rc}")


def info(lib: ctypes.CDLL) -> dict:
    out = (_LL * len(INFO_FIELDS))()
    lib.mg_info(out, len(INFO_FIELDS))
    return dict(zip(INFO_FIELDS, (int(v) for v in out)))
