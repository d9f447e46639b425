"""The C ABI of an sm90a kernel library (``templates/sm90a/kernel.cu.j2``), for ctypes.

Each kernel is one shared library (device code, CUTLASS's host-side parameter builder and the
launch): CUTLASS 3.x kernels take their parameters (TMA descriptors, tile-scheduler state) as one
by-value struct that only the kernel's own host code can build. ``ABI_VERSION`` is rendered into
the source and reported back by ``mg_info``; the launcher refuses a library of another version.
"""
from __future__ import annotations

import ctypes

from ...runtime.library import signature_binder

ABI_VERSION = 3
RASTERS = {"h": 0, "m": 1, "n": 2}  # tile order: CUTLASS's heuristic, weight tiles first, token tiles first
# mg_info's fields, in order.
INFO_FIELDS = ("abi", "params_bytes", "smem_bytes", "threads", "cluster_m", "cluster_n", "stages", "bits",
               "tile_m", "tile_n", "tile_k")
# Negative return codes of mg_init / mg_run (kErr* in gemm_sm90a.cuh); positive ones are cutlass::Status.
ERRORS = {-1: "cuTensorMapReplaceAddress unavailable", -2: "re-targeting the x descriptor failed",
          -3: "re-targeting the y descriptor failed", -4: "workspace too small", -5: "cudaFuncSetAttribute failed",
          -6: "cudaLaunchKernelExC failed", -7: "loading the embedded fatbin (cudaLibraryLoadData) failed"}
CUTLASS_STATUS = {1: "kErrorMisalignedOperand", 2: "kErrorInvalidDataType", 3: "kErrorInvalidLayout",
                  4: "kErrorInvalidProblem", 5: "kErrorNotSupported", 6: "kErrorWorkspaceNull",
                  7: "kErrorInternal", 8: "kErrorArchMismatch", 9: "kErrorInsufficientDriver",
                  10: "kErrorMemoryAllocation", 11: "kInvalid"}

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES = {
    "mg_info": (_I, [ctypes.POINTER(_LL), _I]),
    "mg_create": (_P, []),
    "mg_destroy": (None, [_P]),
    "mg_can_implement": (_I, [_I, _I, _I, _I, _I]),
    "mg_workspace_bytes": (_LL, [_I, _I, _I, _I, _I, _I, _I, _I, _I]),
    "mg_prepare": (_I, []),
    "mg_init": (_I, [_P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I, _I, _P, _LL]),
    "mg_run": (_I, [_P, _P, _P, _P]),
    "mg_layout_offset": (_LL, [_I, _I, _I, _I]),
}


bind = signature_binder(SIGNATURES)  # sets restype/argtypes of every function of a loaded library


def describe(rc: int) -> str:
    """Text of a return code of mg_init / mg_run / mg_can_implement."""
    return ERRORS.get(rc) or f"cutlass::Status {CUTLASS_STATUS.get(rc, rc)}"


def info(lib: ctypes.CDLL) -> dict:
    out = (_LL * len(INFO_FIELDS))()
    lib.mg_info(out, len(INFO_FIELDS))
    return dict(zip(INFO_FIELDS, (int(v) for v in out)))
