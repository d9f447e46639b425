"""Programmatic dependent launch (``Function.launch(..., pdl=True)``) on the CPU: the ctypes mirrors of
cuda.h's ``CUlaunchConfig`` / ``CUlaunchAttribute`` against the C layout, and the launch through
libcuda's ``cuLaunchKernelEx`` (raw) or cuda-python's, with the driver faked: one attribute,
programmatic stream serialization = 1, the grid, block, shared memory and stream of the call, the
configuration built once; without ``pdl`` the plain ``cuLaunchKernel`` as before."""
import ctypes
from types import SimpleNamespace

import pytest

from mixed_gemm.runtime import driver as D
from mixed_gemm.runtime import kernel as K

# cuda.h (CUDA 12.x / 13.0, x86-64 and aarch64): sizeof and offsetof of every field, as a C compiler
# lays them out (the pointer after seven 4-byte fields is padded to offset 32; the attribute's value
# union is 64 bytes, 8-byte aligned, after a 4-byte id and 4 bytes of padding).
CONFIG_LAYOUT = {"gridDimX": 0, "gridDimY": 4, "gridDimZ": 8, "blockDimX": 12, "blockDimY": 16, "blockDimZ": 20,
                 "sharedMemBytes": 24, "hStream": 32, "attrs": 40, "numAttrs": 48}


def test_launch_structs_match_the_c_layout():
    assert ctypes.sizeof(D.LaunchConfig) == 56 and ctypes.alignment(D.LaunchConfig) == 8
    assert {name: getattr(D.LaunchConfig, name).offset for name, _ in D.LaunchConfig._fields_} == CONFIG_LAYOUT
    assert ctypes.sizeof(D.LaunchAttribute) == 72 and ctypes.alignment(D.LaunchAttribute) == 8
    assert (D.LaunchAttribute.id.offset, D.LaunchAttribute.value.offset) == (0, 8)
    assert ctypes.sizeof(D.LaunchAttributeValue) == 64
    assert D.PROGRAMMATIC_STREAM_SERIALIZATION == 6


def test_launch_structs_read_cuda_pythons_own_structs():
    """cuda-python's CUlaunchConfig / CUlaunchAttribute wrap the C structs: filled through it, the
    bytes at their addresses read back through the ctypes mirrors (no GPU needed)."""
    drv = pytest.importorskip("cuda.bindings.driver")
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    mirror = D.LaunchAttribute.from_address(attr.getPtr())
    assert (mirror.id, mirror.value.programmaticStreamSerializationAllowed) == (D.PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 7, 5, 3
    config.blockDimX, config.blockDimY, config.blockDimZ = 256, 2, 1
    config.sharedMemBytes, config.hStream, config.numAttrs = 4096, 0x1234, 1
    c = D.LaunchConfig.from_address(config.getPtr())
    got = (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ, c.sharedMemBytes, c.hStream,
           c.numAttrs)
    assert got == (7, 5, 3, 256, 2, 1, 4096, 0x1234, 1)


OK = 0


class FakeDriver:
    """What Function's constructor and launches call, recorded; cuda-python's launch structs are the
    real ones (plain host objects)."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=OK)

    def __init__(self):
        self.calls = []
        real = pytest.importorskip("cuda.bindings.driver")
        self.CUlaunchAttribute, self.CUlaunchConfig = real.CUlaunchAttribute, real.CUlaunchConfig
        self.CUlaunchAttributeID = real.CUlaunchAttributeID

    def cuModuleGetFunction(self, module, name):
        return OK, 0xF00

    def cuFuncLoad(self, function):
        return (OK,)

    def cuLaunchKernel(self, *args):
        self.calls.append(("cuLaunchKernel",) + args)
        return (OK,)

    def cuLaunchKernelEx(self, config, function, params, extra):
        attr = config.attrs[0]
        self.calls.append(("cuLaunchKernelEx", (config.gridDimX, config.gridDimY, config.gridDimZ),
                           (config.blockDimX, config.blockDimY, config.blockDimZ), config.sharedMemBytes,
                           int(config.hStream), config.numAttrs, int(attr.id),
                           attr.value.programmaticStreamSerializationAllowed, function, params, extra, id(config)))
        return (OK,)


class RawEx:
    """libcuda's cuLaunchKernelEx stand-in: reads the CUlaunchConfig at the address it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, config_addr, function, params, extra):
        c = D.LaunchConfig.from_address(config_addr)
        attr = c.attrs[0]
        self.calls.append(((c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ),
                           c.sharedMemBytes, c.hStream, c.numAttrs, attr.id,
                           attr.value.programmaticStreamSerializationAllowed, function, params, extra, config_addr))
        return OK


class Args(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int)]


def _function(monkeypatch, raw: bool):
    drv = FakeDriver()
    plain, ex = [], RawEx()
    monkeypatch.setattr(K, "driver", lambda: drv)
    monkeypatch.setattr(D, "driver", lambda: drv)
    monkeypatch.setattr(K, "raw_launch", lambda: (lambda *a: plain.append(a) or OK) if raw else None)
    monkeypatch.setattr(K, "raw_launch_ex", lambda: ex if raw else None)
    fn = K.Function("module", "kern", Args, threads=256, smem=0, device_index=0)
    return fn, drv, plain, ex


def test_pdl_launch_goes_through_raw_cuLaunchKernelEx_with_the_attribute(monkeypatch):
    fn, drv, plain, ex = _function(monkeypatch, raw=True)
    fn.launch((3, 2, 1), 0xABC, pdl=True)
    fn.launch((9, 1, 4), 0xDEF, smem=1024, pdl=True)
    assert plain == [] and drv.calls == []
    (g1, b1, s1, st1, n1, id1, on1, f1, p1, e1, addr1), (g2, b2, s2, st2, n2, id2, on2, f2, p2, e2, addr2) = ex.calls
    assert (g1, b1, s1, st1, n1, id1, on1) == ((3, 2, 1), (256, 1, 1), 0, 0xABC, 1, 6, 1)
    assert (g2, b2, s2, st2, n2, id2, on2) == ((9, 1, 4), (256, 1, 1), 1024, 0xDEF, 1, 6, 1)
    assert f1 == f2 == 0xF00 and p1 == p2 == ctypes.addressof(fn._argv) and e1 is e2 is None
    assert addr1 == addr2  # one configuration per function, refilled per launch
    fn.launch((1, 1, 1), 0x5)  # without pdl: cuLaunchKernel as before
    assert len(plain) == 1 and plain[0][:9] == (0xF00, 1, 1, 1, 256, 1, 1, 0, 0x5) and len(ex.calls) == 2


def test_pdl_launch_through_cuda_python_when_libcuda_is_not_at_hand(monkeypatch):
    fn, drv, plain, ex = _function(monkeypatch, raw=False)
    args, argv = fn.block()
    fn.launch((4, 3, 2), 77, argv, smem=512, pdl=True)
    fn.launch((1, 2, 3), 78, argv, pdl=True)
    (name, grid, block, smem, stream, n, attr, on, function, params, extra, cfg), second = drv.calls
    assert (name, grid, block, smem, stream, n, on, function, params, extra) == \
        ("cuLaunchKernelEx", (4, 3, 2), (256, 1, 1), 512, 77, 1, 1, 0xF00, argv, 0)
    assert attr == D.PROGRAMMATIC_STREAM_SERIALIZATION
    assert second[1:5] == ((1, 2, 3), (256, 1, 1), 0, 78) and second[-1] == cfg  # the same config object
    fn.launch((2, 2, 2), 79, argv)
    assert drv.calls[-1][0] == "cuLaunchKernel" and drv.calls[-1][1:5] == (0xF00, 2, 2, 2)
    assert plain == [] and ex.calls == []
