"""The kernel's argument block as a ctypes structure: the Python mirror of ``mixed_gemm::GemmArgs``.

Rendered sources static_assert ``sizeof(GemmArgs)`` against this structure's size, so a field added
on one side only fails at compile time instead of corrupting a launch.
"""
from __future__ import annotations

import ctypes


class GemmArgs(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("zeros", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("c", ctypes.c_void_p),
        ("m", ctypes.c_int),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("n_pad", ctypes.c_int),
        ("k16", ctypes.c_int),
        ("lda", ctypes.c_int),
        ("ldc", ctypes.c_int),
        ("group_shift", ctypes.c_int),
        ("num_groups", ctypes.c_int),
    ]


GEMM_ARGS_BYTES = ctypes.sizeof(GemmArgs)
