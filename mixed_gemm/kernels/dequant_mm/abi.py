"""The dequantize kernels' argument blocks: Python mirrors of ``mixed_gemm::DequantArgs``
(templates/dequant_mm/dequant_kernel.cuh) and ``mixed_gemm::DequantSm90aArgs``
(dequant_sm90a.cuh); rendered sources static_assert their sizes."""
from __future__ import annotations

import ctypes

_p, _i = ctypes.c_void_p, ctypes.c_int


class DequantArgs(ctypes.Structure):
    _fields_ = [
        ("b", _p), ("scales", _p), ("zeros", _p), ("out", _p),
        ("n", _i), ("k", _i), ("n_pad", _i), ("k16", _i), ("ldo", _i), ("group_shift", _i), ("num_groups", _i),
    ]


class DequantSm90aArgs(ctypes.Structure):
    """mixed_gemm::DequantSm90aArgs (templates/dequant_mm/dequant_sm90a.cuh)."""

    _fields_ = [
        ("b", _p), ("scales", _p), ("zeros", _p), ("out", _p),
        ("n", _i), ("k", _i), ("strips", _i), ("katoms", _i), ("ldo", _i), ("group_shift", _i), ("num_groups", _i),
    ]


DEQUANT_ARGS_BYTES = ctypes.sizeof(DequantArgs)
DEQUANT_SM90A_ARGS_BYTES = ctypes.sizeof(DequantSm90aArgs)
