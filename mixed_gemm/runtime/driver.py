"""Thin, checked access to ``cuda.bindings.driver`` inside torch's primary contexts."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os

import torch


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed."""


@functools.lru_cache(maxsize=1)
def driver():
    try:
        from cuda.bindings import driver as drv
    except ImportError as exc:  # pragma: no cover - dependency missing
        raise CudaDriverError("cuda-python (cuda.bindings) is required to launch kernels") from exc
    return drv


def check(result, what: str):
    """Unwrap a cuda.bindings result tuple, raising on anything but CUDA_SUCCESS."""
    drv = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise CudaDriverError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


_LIVE = set()  # devices whose primary context torch has made (it never destroys it)


@contextlib.contextmanager
def primary_context(device_index: int):
    """Make torch's (primary) context of ``device_index`` current for the duration of the block.
    No host sync after the first use on a device: occupancy queries and loads run inside it while
    other work is in flight, and under CUDA-graph capture, where a synchronize is illegal."""
    drv = driver()
    if device_index not in _LIVE:
        torch.cuda.init()
        # torch creates the primary context lazily; touching the device guarantees it exists.
        torch.cuda.synchronize(device_index)
        _LIVE.add(device_index)
    dev = check(drv.cuDeviceGet(device_index), "cuDeviceGet")
    ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        yield ctx
    finally:
        check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
        check(drv.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")


@functools.lru_cache(maxsize=1)
def raw_launch():
    """``cuLaunchKernel`` called straight from libcuda through ctypes with fixed argument types, or
    None where libcuda cannot be opened this way. cuda-python's wrapper converts and checks every
    argument object on each call; with raw handles and a pre-built argument array the hot path
    is one foreign call (docs/notes/measurement.md has the measured host cost)."""
    try:
        lib = ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
        fn = lib.cuLaunchKernel
    except (OSError, AttributeError):
        return None
    u = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn
