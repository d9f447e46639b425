"""The dequantize kernel's argument block: Python mirror of ``mixed_gemm::DequantArgs``
(templates/dequant_mm/dequant_kernel.cuh); rendered sources static_assert its size."""
from __future__ import annotations

import ctypes

_p, _i = ctypes.c_void_p, ctypes.c_int


class DequantArgs(ctypes.Structure):
    _fields_ = [
        ("b", _p), ("scales", _p), ("zeros", _p), ("out", _p),
        ("n", _i), ("k", _i), ("n_pad", _i), ("k16", _i), ("ldo", _i), ("group_shift", _i), ("num_groups", _i),
    ]


DEQUANT_ARGS_BYTES = ctypes.sizeof(DequantArgs)
