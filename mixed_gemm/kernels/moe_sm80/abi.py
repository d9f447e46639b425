"""The moe_sm80 kernels' argument blocks as ctypes structures: Python mirrors of the C++ structs in
templates/moe_sm80/kernel.cu.j2 (each rendered source static_asserts their sizes against these)."""
from __future__ import annotations

import ctypes

from ..sm80.abi import GemmArgs

_p, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong

ROUTE_THREADS = 256  # mixed_gemm::moe_route::kRouteThreads (templates/common/moe_route.cuh)
ROUTE_VEC = 8        # activations per 16-byte vector (moe_route::kVec)


class GroupedArgs(ctypes.Structure):
    """mixed_gemm::moe_sm80::GroupedArgs."""

    _fields_ = [("gemm", GemmArgs), ("offsets", _p), ("counts", _p), ("tile_ends", _p), ("b_stride", _ll),
                ("p_stride", _ll), ("experts", _i)]


class CombineArgs(ctypes.Structure):
    """mixed_gemm::moe_sm80::CombineArgs."""

    _fields_ = [("o", _p), ("pos", _p), ("weights", _p), ("y", _p), ("hidden", _i), ("top_k", _i)]


GROUPED_ARGS_BYTES = ctypes.sizeof(GroupedArgs)
COMBINE_ARGS_BYTES = ctypes.sizeof(CombineArgs)
