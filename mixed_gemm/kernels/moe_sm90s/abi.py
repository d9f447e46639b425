"""The C ABI of a moe_sm90s kernel library (``templates/moe_sm90s/kernel.cu.j2``), for ctypes: the
grouped sm90s kernel's descriptors and launch, and the routing kernels around it. Return codes are
the dense sm90s family's (``sm90s.abi.describe``)."""
from __future__ import annotations

import ctypes

from ...runtime.library import signature_binder
from ..sm90s.abi import SIGNATURES as DENSE_SIGNATURES
from ..sm90s.abi import describe

ABI_VERSION = 4
INFO_FIELDS = ("abi", "params_bytes", "smem_bytes", "threads", "stages", "bits", "tile_m", "tile_n", "tile_k")

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
# The slot functions are the dense family's (templates/sm90s/host.cuh); init and run take the experts.
SIGNATURES = {
    **{f: DENSE_SIGNATURES[f] for f in ("mg_info", "mg_create", "mg_destroy", "mg_prepare", "mg_workspace_floats",
                                        "mg_counters")},
    "mg_init": (_I, [_P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _LL, _LL, _I, _I, _I]),
    "mg_run": (_I, [_P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _I, _P, _P, _P]),
    "mg_combine": (_I, [_P, _P, _P, _P, _LL, _I, _I, _P]),
    "mg_route": (_I, [_P, _I, _P]),
    "mg_gather": (_I, [_P, _P, _I, _P, _LL, _I, _P]),
}

bind = signature_binder(SIGNATURES)  # sets restype/argtypes of every function of a loaded library


def info(lib: ctypes.CDLL) -> dict:
    out = (_LL * len(INFO_FIELDS))()
    lib.mg_info(out, len(INFO_FIELDS))
    return dict(zip(INFO_FIELDS, (int(v) for v in out)))


__all__ = ["ABI_VERSION", "INFO_FIELDS", "bind", "describe", "info"]
