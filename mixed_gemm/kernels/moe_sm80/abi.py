"""The moe_sm80 kernels' argument blocks as ctypes structures: Python mirrors of the C++ structs in
templates/moe_sm80/kernel.cu.j2 (each rendered source static_asserts their sizes against these; the
route kernels' block is ``kernels.moe_route.SortArgs``)."""
from __future__ import annotations

import ctypes

from ..sm80.abi import GemmArgs

_p, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong

ROUTE_THREADS = 256  # mixed_gemm::moe_route::kRouteThreads (templates/common/moe_route.cuh)
ROUTE_VEC = 8        # activations per 16-byte vector (moe_route::kVec)


class GroupedArgs(ctypes.Structure):
    """mixed_gemm::moe_sm80::GroupedArgs."""

    _fields_ = [("gemm", GemmArgs), ("offsets", _p), ("counts", _p), ("tile_ends", _p), ("order", _p),
                ("weights", _p), ("y32", _p), ("b_stride", _ll), ("p_stride", _ll), ("experts", _i), ("a_div", _i),
                ("top_k", _i)]


class CombineArgs(ctypes.Structure):
    """mixed_gemm::moe_sm80::CombineArgs."""

    _fields_ = [("o", _p), ("pos", _p), ("weights", _p), ("y", _p), ("hidden", _i), ("top_k", _i)]


class GatherArgs(ctypes.Structure):
    """mixed_gemm::moe_sm80::GatherArgs."""

    _fields_ = [("x", _p), ("order", _p), ("out", _p), ("div", _i), ("cols", _i), ("rows", _i)]


BAND = 8  # mixed_gemm::moe_sm80::kBand: M tiles per band of the grouped grid's tile order
GROUPED_ARGS_BYTES = ctypes.sizeof(GroupedArgs)
GATHER_ARGS_BYTES = ctypes.sizeof(GatherArgs)
COMBINE_ARGS_BYTES = ctypes.sizeof(CombineArgs)
