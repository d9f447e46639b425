"""The gemv kernel's argument block: Python mirror of ``mixed_gemm::GemvArgs``
(templates/gemv/gemv.cuh); rendered sources static_assert its size."""
from __future__ import annotations

import ctypes

_p, _i = ctypes.c_void_p, ctypes.c_int


class GemvArgs(ctypes.Structure):
    _fields_ = [
        ("x", _p), ("b", _p), ("scales", _p), ("zeros", _p), ("bias", _p), ("residual", _p), ("y", _p), ("workspace", _p),
        ("counters", _p),
        ("m", _i), ("n", _i), ("k", _i), ("strips", _i), ("katoms", _i), ("group_shift", _i), ("num_groups", _i),
        ("splits", _i), ("chunk", _i),
    ]


GEMV_ARGS_BYTES = ctypes.sizeof(GemvArgs)
