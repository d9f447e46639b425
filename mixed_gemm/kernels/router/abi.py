"""The router kernel's argument block: Python mirror of ``mixed_gemm::RouterArgs``
(templates/router/router.cuh); rendered sources static_assert its size."""
from __future__ import annotations

import ctypes

_p, _i = ctypes.c_void_p, ctypes.c_int


class RouterArgs(ctypes.Structure):
    _fields_ = [("x", _p), ("weight", _p), ("logits", _p), ("scores", _p), ("ids", _p), ("counters", _p),
                ("tokens", _i), ("experts", _i), ("hidden", _i), ("top_k", _i), ("renormalize", _i),
                ("scale", ctypes.c_float)]


ROUTER_ARGS_BYTES = ctypes.sizeof(RouterArgs)
