"""The grouped decode kernel's argument block: Python mirror of ``mixed_gemm::MoeGemvArgs``
(templates/moe_gemv/moe_gemv.cuh); rendered sources static_assert its size."""
from __future__ import annotations

import ctypes

_p, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong


class MoeGemvArgs(ctypes.Structure):
    _fields_ = [
        ("x", _p), ("b", _p), ("scales", _p), ("zeros", _p), ("ids", _p), ("weights", _p), ("y", _p),
        ("workspace", _p), ("counters", _p),
        ("expert_b", _ll), ("expert_s", _ll),
        ("tokens", _i), ("top_k", _i), ("experts", _i), ("n", _i), ("k", _i), ("strips", _i), ("katoms", _i),
        ("group_shift", _i), ("num_groups", _i), ("splits", _i), ("chunk", _i), ("slots", _i), ("z0", _i),
        ("ids_64", _i), ("chunks", _i), ("gate_up", _i), ("pdl", _i), ("weights_dtype", _i),
    ]


MOE_GEMV_ARGS_BYTES = ctypes.sizeof(MoeGemvArgs)


class MoeGemvFusedArgs(ctypes.Structure):
    """``mixed_gemm::MoeGemvFusedArgs`` (templates/moe_gemv/moe_fused.cuh): the one-launch persistent
    mode's two projections and its queue / per-expert counters."""
    _fields_ = [("up", MoeGemvArgs), ("down", MoeGemvArgs), ("sync", _p)]


MOE_GEMV_FUSED_ARGS_BYTES = ctypes.sizeof(MoeGemvFusedArgs)
