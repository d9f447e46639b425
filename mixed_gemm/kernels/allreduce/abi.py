"""The all-reduce kernels' argument block: Python mirror of ``mixed_gemm::AllReduceArgs``
(templates/allreduce/allreduce.cuh); rendered sources static_assert its size."""
from __future__ import annotations

import ctypes

from .config import MAX_RANKS

_p, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong


class AllReduceArgs(ctypes.Structure):
    _fields_ = [
        ("peers", _p * MAX_RANKS), ("in_", _p), ("out", _p), ("residual", _p), ("residual_out", _p), ("weight", _p),
        ("numel", _ll), ("slot_bytes", _ll), ("rows", _i), ("cols", _i), ("rank", _i), ("active_blocks", _i),
        ("eps", ctypes.c_float), ("timeout_ns", ctypes.c_ulonglong),
    ]


ALLREDUCE_ARGS_BYTES = ctypes.sizeof(AllReduceArgs)
