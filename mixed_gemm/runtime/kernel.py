"""Loaded kernels: one module load per (kernel, device) per process, and a lean launch path.

Each :class:`Function` keeps its ctypes argument block and the one-element pointer array that
``cuLaunchKernel`` wants alive, so a launch only fills fields and calls the driver: libcuda's
``cuLaunchKernel`` through ctypes with raw handles (:func:`.driver.raw_launch`), else cuda-python's
wrapper. A lock guards the block: the driver copies the arguments during the call, so the critical
section is exactly fill + launch.

``launch(..., pdl=True)``: a programmatic dependent launch (Hopper's PDL) through ``cuLaunchKernelEx``
with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: the kernel may start while the one
before it on the stream finishes, so it must execute ``griddepcontrol.wait`` before it reads that
kernel's outputs or writes memory that kernel uses. The launch configuration is built once per
function and only its grid, shared memory and stream are filled per launch (under the lock, like the
argument block). Stream capture (CUDA 12.3+) records such a launch as a programmatic edge of the
graph, so graphs keep the overlap.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Dict, Optional, Tuple

import torch

from ..compile import BuildSpec, build_spec, load_bytes
from .driver import (PROGRAMMATIC_STREAM_SERIALIZATION, CudaDriverError, LaunchAttribute, LaunchConfig, check, driver,
                     load_function, primary_context, raw_launch, raw_launch_ex)


def _stream_handle(device_index: int) -> int:
    return torch.cuda.current_stream(device_index).cuda_stream


# current_stream(device_index): torch's current stream on that device as a raw handle (an int). The
# accessor Triton and Inductor use, bound as is: no Stream object, and no Python frame per launch.
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _stream_handle


class Function:
    """One ``extern "C"`` kernel of a loaded module, with its argument block."""

    def __init__(self, module, name: str, args_type, threads: int, smem: int, device_index: int):
        drv = driver()
        self.name = name
        self.device_index = device_index
        self._function = check(drv.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
        load_function(self._function)  # now, not at a first launch (see load_function)
        if smem > 0:  # dynamic shared memory: opt in to it (static + dynamic above 48 KB needs it)
            attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            optin = check(drv.cuDeviceGetAttribute(attr, device_index), "cuDeviceGetAttribute")
            if smem > optin:
                raise CudaDriverError(f"{name} needs {smem} bytes of shared memory; device {device_index} "
                                      f"allows {optin}")
            check(drv.cuFuncSetAttribute(self._function,
                                         drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         smem), "cuFuncSetAttribute")
        self.args = args_type()
        self._argv = (ctypes.c_void_p * 1)(ctypes.addressof(self.args))
        self._argv_addr = ctypes.addressof(self._argv)
        self._threads = threads
        self._smem = smem
        self.lock = threading.Lock()
        self._raw = raw_launch()
        self._handle = int(self._function)
        self._launch = drv.cuLaunchKernel
        self._ok = drv.CUresult.CUDA_SUCCESS
        self._pdl = None  # the PDL launch configuration, built at the first PDL launch (_pdl_config)

    def block(self):
        """A fresh argument block of this kernel and the address of its one-element pointer array:
        ``(args, argv_address)``, for callers that keep one block per weight (see launch)."""
        args = self.args.__class__()
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        args._argv = argv  # keep the array alive as long as the block
        return args, ctypes.addressof(argv)

    def occupancy(self, smem: int = 0) -> int:
        """CTAs of this kernel one multiprocessor holds at once with ``smem`` bytes of dynamic
        shared memory (the driver's occupancy calculator: registers, shared memory, threads). No host
        sync (the module's load made the context): callable while kernels run and under capture."""
        drv = driver()
        with primary_context(self.device_index):
            return check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._function, self._threads, smem),
                         "cuOccupancyMaxActiveBlocksPerMultiprocessor")

    def launch(self, grid: Tuple[int, int, int], stream: int, argv_addr: int = 0, smem: Optional[int] = None,
               pdl: bool = False) -> None:
        """Launch on ``stream`` (a raw handle) with ``self.args``, or with the block whose pointer
        array is at ``argv_addr`` (from :meth:`block`). Callers fill the block and launch while
        holding ``self.lock``. ``smem``: dynamic shared memory of this launch, at most the
        function's (default: the function's). ``pdl``: a programmatic dependent launch (module
        docstring; the kernel must wait with ``griddepcontrol.wait``)."""
        argv_addr = argv_addr or self._argv_addr
        smem = self._smem if smem is None else smem
        if pdl:
            self._launch_pdl(grid, stream, argv_addr, smem)
            return
        raw = self._raw
        if raw is not None:
            err = raw(self._handle, grid[0], grid[1], grid[2], self._threads, 1, 1, smem, stream,
                      argv_addr, None)
            if err:
                check((driver().CUresult(err),), f"cuLaunchKernel({self.name})")
            return
        err = self._launch(self._function, grid[0], grid[1], grid[2], self._threads, 1, 1, smem,
                           stream, argv_addr, 0)[0]
        if err != self._ok:
            check((err,), f"cuLaunchKernel({self.name})")

    def _pdl_config(self):
        """``(raw cuLaunchKernelEx or None, config, config address)``: a ``CUlaunchConfig`` carrying
        one attribute, programmatic stream serialization = 1, with this function's block size;
        ctypes structures for libcuda's entry point (driver.LaunchConfig), else cuda-python's."""
        raw = raw_launch_ex() if self._raw is not None else None
        if raw is not None:
            attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
            attr.value.programmaticStreamSerializationAllowed = 1
            config = LaunchConfig(blockDimX=self._threads, blockDimY=1, blockDimZ=1, numAttrs=1)
            config.attrs = ctypes.pointer(attr)
            config._attr = attr  # kept alive as long as the configuration
            self._pdl = (raw, config, ctypes.addressof(config))
            return self._pdl
        drv = driver()
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = drv.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = self._threads, 1, 1
        config.attrs = [attr]
        config.numAttrs = 1
        self._pdl = (None, config, 0)
        return self._pdl

    def _launch_pdl(self, grid, stream: int, argv_addr: int, smem: int) -> None:
        raw, config, addr = self._pdl or self._pdl_config()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.sharedMemBytes = smem
        config.hStream = stream
        if raw is not None:
            err = raw(addr, self._handle, argv_addr, None)
            if err:
                check((driver().CUresult(err),), f"cuLaunchKernelEx({self.name})")
            return
        err = driver().cuLaunchKernelEx(config, self._function, argv_addr, 0)[0]
        if err != self._ok:
            check((err,), f"cuLaunchKernelEx({self.name})")


class Module:
    """One fatbin, loaded into torch's primary context of one device.

    The runtime knows no kernel families: it gets the kernel's :class:`~mixed_gemm.compile.BuildSpec`
    (name, a thunk that renders its source only when a key or a build needs it, arch flags).

    Loading never synchronizes the device on our side (:func:`.driver.primary_context`), so a lazy
    load during eager decode does not wait for the kernels in flight. The driver itself may still
    wait inside ``cuModuleLoadData`` (it can need context synchronization to place code): callers
    whose kernels wait for each other on one GPU (emulated tensor-parallel ranks) load every
    kernel before launching any.
    """

    def __init__(self, spec: BuildSpec, device_index: int):
        drv = driver()
        self.name = name = spec.name
        fatbin = load_bytes(build_spec(spec))
        with primary_context(device_index):
            self._module = check(drv.cuModuleLoadData(fatbin), f"cuModuleLoadData({name})")
        self._functions: Dict[str, Function] = {}
        self._device_index = device_index

    def function(self, name: str, args_type, threads: int, smem: int = 0) -> Function:
        fn = self._functions.get(name)
        if fn is None:
            with primary_context(self._device_index):
                fn = self._functions[name] = Function(self._module, name, args_type, threads, smem,
                                                      self._device_index)
        return fn


_MODULES: Dict[Tuple[str, int], Module] = {}
_MODULES_LOCK = threading.Lock()


def get_module(spec: BuildSpec, device_index: int) -> Module:
    """The loaded module of ``spec`` on ``device_index``; taken from a kernel package or the
    kernel cache (or built) and loaded on first use. Kernel names derive from configs, so the name
    identifies the module."""
    key = (spec.name, device_index)
    module = _MODULES.get(key)
    if module is None:
        with _MODULES_LOCK:
            module = _MODULES.get(key)
            if module is None:
                module = _MODULES[key] = Module(spec, device_index)
    return module
