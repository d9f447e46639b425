"""The sm80 kernels' argument blocks as ctypes structures: Python mirrors of the C++ structs.

Rendered sources static_assert each struct's size against these, so a field added on one side only
fails at compile time instead of corrupting a launch.
"""
from __future__ import annotations

import ctypes

_p, _i = ctypes.c_void_p, ctypes.c_int


class GemmArgs(ctypes.Structure):
    """mixed_gemm::GemmArgs (templates/sm80/gemm_sm80.cuh)."""

    _fields_ = [
        ("a", _p), ("b", _p), ("scales", _p), ("zeros", _p), ("bias", _p), ("residual", _p), ("c", _p),
        ("workspace", _p), ("semaphores", _p),
        ("m", _i), ("n", _i), ("k", _i), ("n_pad", _i), ("k16", _i), ("lda", _i), ("ldc", _i),
        ("group_shift", _i), ("num_groups", _i), ("split_mode", _i), ("log_tile", _i),
    ]


class ReduceArgs(ctypes.Structure):
    """mixed_gemm::ReduceArgs (templates/sm80/reduce.cuh)."""

    _fields_ = [("workspace", _p), ("bias", _p), ("residual", _p), ("c", _p), ("m", _i), ("n", _i), ("ldc", _i), ("splits", _i)]


GEMM_ARGS_BYTES = ctypes.sizeof(GemmArgs)
REDUCE_ARGS_BYTES = ctypes.sizeof(ReduceArgs)
