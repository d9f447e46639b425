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


@functools.lru_cache(maxsize=None)
def _primary(device_index: int):
    """The primary context of ``device_index`` (torch's: the CUDA runtime only uses primary
    contexts), retained once for the life of the process and never released.

    Nothing here synchronizes the device. A lazy module load or workspace growth runs during eager
    decode while kernels run, and between emulated tensor-parallel ranks' launches, where a kernel
    waits for a peer not launched yet: a device-wide synchronization there stalls decode, or waits
    forever. Retaining the context creates it where torch has not yet (the runtime adopts the same
    primary context later); keeping that reference means no release can ever drop the count to
    zero and destroy the context under torch, which is why nothing has to touch torch's device first."""
    drv = driver()
    torch.cuda.init()  # torch's lazy CUDA state (device count, fork checks); launches nothing
    dev = check(drv.cuDeviceGet(device_index), "cuDeviceGet")
    return check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


@contextlib.contextmanager
def primary_context(device_index: int):
    """Make torch's (primary) context of ``device_index`` current for the duration of the block;
    never synchronizes (see :func:`_primary`)."""
    drv = driver()
    ctx = _primary(device_index)
    check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        yield ctx
    finally:
        check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")


def load_function(function) -> None:
    """Finish loading ``function`` now. Under lazy loading (torch sets CUDA_MODULE_LOADING=LAZY) a
    handle may be only partly loaded, and the driver then loads it at the first launch, which may
    synchronize the context: a kernel whose first launch comes while a peer's kernel waits for it
    (emulated tensor-parallel ranks on one GPU) would wait for that wait. ``cuFuncLoad`` (driver
    12.4+) loads it explicitly; an older driver loads it for an attribute query."""
    drv = driver()
    load = getattr(drv, "cuFuncLoad", None)
    if load is not None:
        try:
            if load(function)[0] == drv.CUresult.CUDA_SUCCESS:
                return
        except RuntimeError:  # the driver lacks the entry point
            pass
    check(drv.cuFuncGetAttribute(drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, function), "cuFuncGetAttribute")


@functools.lru_cache(maxsize=1)
def _libcuda():
    """libcuda opened through ctypes, or None where it cannot be opened this way."""
    try:
        return ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def raw_launch():
    """``cuLaunchKernel`` called straight from libcuda through ctypes with fixed argument types, or
    None where libcuda cannot be opened this way. cuda-python's wrapper converts and checks every
    argument object on each call; with raw handles and a pre-built argument array the hot path
    is one foreign call (docs/notes/measurement.md has the measured host cost)."""
    fn = getattr(_libcuda(), "cuLaunchKernel", None)
    if fn is None:
        return None
    u = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


# Programmatic dependent launch (PDL, sm_90+): a kernel launched with this attribute may start
# while the kernel before it on the stream still runs, once every CTA of that kernel has executed
# griddepcontrol.launch_dependents (or exited); its griddepcontrol.wait then waits for that kernel
# to complete and its memory to be visible. cuda.h's CUlaunchAttributeID value.
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttributeValue(ctypes.Union):
    """``CUlaunchAttributeValue`` (cuda.h): a 64-byte union, 8-byte aligned (some members hold
    pointers); only the member PDL sets is named."""
    _fields_ = [("pad", ctypes.c_char * 64), ("programmaticStreamSerializationAllowed", ctypes.c_int),
                ("_align", ctypes.c_void_p)]


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): the id (a 4-byte enum), padding to 8, the value: 72 bytes."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h): grid and block sizes, dynamic shared memory, the stream (at
    offset 32), the attribute array and its length: 56 bytes."""
    _fields_ = [(name, ctypes.c_uint) for name in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY",
                                                   "blockDimZ", "sharedMemBytes")] + [
        ("hStream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=1)
def raw_launch_ex():
    """``cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** params, void** extra)`` from
    libcuda through ctypes (as :func:`raw_launch`), or None where libcuda cannot be opened this way
    or predates it (driver < 11.8): the caller then launches through cuda-python."""
    fn = getattr(_libcuda(), "cuLaunchKernelEx", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn
