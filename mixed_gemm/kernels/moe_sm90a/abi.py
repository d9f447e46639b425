"""The C ABI of a moe_sm90a kernel library (``templates/moe_sm90a/kernel.cu.j2``), for ctypes.

Like the dense sm90a libraries, each kernel is one shared library: CUTLASS's grouped kernel takes
its parameters (placeholder TMA descriptors, the group scheduler's state, the addresses of the
per-expert device arrays) as one by-value struct that only its own host code can build.
"""
from __future__ import annotations

import ctypes

from ...runtime.library import signature_binder

from ..sm90a.abi import describe  # the same error codes (sm90a::kErr*) and cutlass::Status

ABI_VERSION = 5
# mg_info's fields, in order: then the bytes of one expert's entry in each device array.
INFO_FIELDS = ("abi", "params_bytes", "smem_bytes", "threads", "stages", "bits", "tile_m", "tile_n", "tile_k",
               "cluster_m", "shape_bytes", "layout_w_bytes", "stride_x_bytes", "stride_s_bytes", "stride_y_bytes")
STRIDE_FIELDS = INFO_FIELDS[11:]  # the order mg_strides writes them in

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES = {
    "mg_info": (_I, [ctypes.POINTER(_LL), _I]),
    "mg_strides": (_I, [_P, _I, _I, _I]),
    "mg_workspace_bytes": (_LL, [_I, _I]),
    "mg_prepare": (_I, []),
    "mg_run": (_I, [_I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _P, _LL, _I, _I, _P]),
    "mg_combine": (_I, [_P, _P, _P, _P, _LL, _I, _I, _P]),
    "mg_route": (_I, [_P, _I, _P]),
    "mg_gather": (_I, [_P, _P, _I, _P, _LL, _I, _P]),
    "mg_pointers": (_I, [_I, _P, _P, _P, _I, _I, _P, _LL, _P, _LL, _P, _P, _P]),
}


bind = signature_binder(SIGNATURES)  # sets restype/argtypes of every function of a loaded library


def info(lib: ctypes.CDLL) -> dict:
    out = (_LL * len(INFO_FIELDS))()
    lib.mg_info(out, len(INFO_FIELDS))
    return dict(zip(INFO_FIELDS, (int(v) for v in out)))


__all__ = ["ABI_VERSION", "INFO_FIELDS", "STRIDE_FIELDS", "bind", "describe", "info"]
