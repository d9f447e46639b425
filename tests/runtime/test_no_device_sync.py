"""The runtime never synchronizes the device, on the CPU against a fake driver: a lazy module load
or a workspace growth happens during eager decode, and between emulated tensor-parallel ranks'
launches, while a kernel may wait for a peer not launched yet; a device-wide synchronization
there stalls decode or waits forever."""
import importlib
from types import SimpleNamespace

import pytest
import torch

from mixed_gemm.runtime import driver as D

W = importlib.import_module("mixed_gemm.runtime.workspace")  # the package exports a function of that name

OK = 0


class FakeDriver:
    """The driver calls the runtime makes, recorded; anything that synchronizes fails the test."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=OK)
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_NUM_REGS=4)

    def __init__(self, func_load=True):
        self.calls, self.next_ptr = [], 1 << 20
        if not func_load:
            self.cuFuncLoad = self._missing

    def _missing(self, function):
        raise RuntimeError('Function "cuFuncLoad" not found')

    def cuGetErrorName(self, err):
        return OK, b"CUDA_ERROR_FAKE"

    def cuDeviceGet(self, index):
        self.calls.append(("cuDeviceGet", index))
        return OK, 100 + index

    def cuDevicePrimaryCtxRetain(self, dev):
        self.calls.append(("retain", dev))
        return OK, f"ctx{dev}"

    def cuDevicePrimaryCtxRelease(self, dev):
        raise AssertionError("the primary context is retained for the process, never released")

    def cuCtxPushCurrent(self, ctx):
        self.calls.append(("push", ctx))
        return (OK,)

    def cuCtxPopCurrent(self):
        self.calls.append(("pop",))
        return OK, "ctx"

    def cuMemAlloc(self, nbytes):
        self.calls.append(("alloc", nbytes))
        self.next_ptr += nbytes
        return OK, self.next_ptr

    def cuMemsetD8Async(self, ptr, value, nbytes, stream):
        self.calls.append(("memset_async", ptr, value, nbytes, stream))
        return (OK,)

    def cuMemsetD8(self, *args):
        raise AssertionError("cuMemsetD8 runs on the legacy default stream")

    def cuCtxSynchronize(self):
        raise AssertionError("cuCtxSynchronize waits for every kernel of the device")

    def cuFuncLoad(self, function):
        self.calls.append(("cuFuncLoad", function))
        return (OK,)

    def cuFuncGetAttribute(self, attr, function):
        self.calls.append(("cuFuncGetAttribute", attr, function))
        return OK, 32


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver()
    _install(monkeypatch, drv)
    return drv


def _install(monkeypatch, drv):
    monkeypatch.setattr(D, "driver", lambda: drv)
    monkeypatch.setattr(W, "driver", lambda: drv)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)

    def no_sync(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize waits for every kernel of the device")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(W, "_capturing", lambda: False)
    monkeypatch.setattr(W, "_BUFFERS", {})
    monkeypatch.setattr(W, "_RETIRED", [])
    D._primary.cache_clear()


@pytest.fixture(autouse=True)
def _clear_primary_cache():
    yield
    D._primary.cache_clear()


def test_primary_context_is_retained_once_and_pushed_without_a_sync(fake):
    for _ in range(3):
        with D.primary_context(1) as ctx:
            assert ctx == "ctx101"
    assert [c for c in fake.calls if c[0] == "retain"] == [("retain", 101)]
    assert [c[0] for c in fake.calls if c[0] in ("push", "pop")] == ["push", "pop"] * 3


def test_a_context_is_popped_when_the_block_raises(fake):
    with pytest.raises(ValueError):
        with D.primary_context(0):
            raise ValueError("inside")
    assert fake.calls[-1] == ("pop",)


def test_semaphores_are_zeroed_on_the_calling_stream(fake):
    ptr = W.semaphores(0, 777, 10)
    memsets = [c for c in fake.calls if c[0] == "memset_async"]
    # The stream's buffer and the graph slot sized for a later capture, both on stream 777.
    assert len(memsets) == 2 and {c[4] for c in memsets} == {777} and all(c[2] == 0 for c in memsets)
    assert ptr in {c[1] for c in memsets}
    assert all(c[3] >= 40 for c in memsets)
    fake.calls.clear()
    assert W.semaphores(0, 777, 10) == ptr  # no growth: nothing allocated or zeroed
    assert fake.calls == []


def test_growth_zeroes_the_new_buffer_on_the_stream_that_grows_it(fake):
    small = W.semaphores(0, 5, 8)
    big = W.semaphores(0, 9, 1 << 20)  # another stream, larger than any buffer so far
    assert big != small
    grown = [c for c in fake.calls if c[0] == "memset_async" and c[3] >= 4 << 20]
    assert grown and all(c[4] == 9 for c in grown)


def test_partials_are_not_zeroed(fake):
    W.workspace(0, 3, 1000)
    assert [c for c in fake.calls if c[0] == "memset_async"] == []
    assert [c[0] for c in fake.calls].count("alloc") == 2  # the stream's and the graph slot's


def test_functions_are_loaded_when_made(fake):
    D.load_function("fn")
    assert fake.calls == [("cuFuncLoad", "fn")]


def test_a_driver_without_cuFuncLoad_loads_through_an_attribute_query(monkeypatch):
    drv = FakeDriver(func_load=False)
    _install(monkeypatch, drv)
    D.load_function("fn")
    assert drv.calls == [("cuFuncGetAttribute", 4, "fn")]
