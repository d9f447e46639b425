"""The sm90a launcher's Params cache on the CPU, against a fake kernel library: one slot per
(weight, bias, M bucket); a call with the slot's M only re-targets x and y; a new M, or a moved
split-K workspace, rebuilds the Params; errors name the config and the library's reason."""
import contextlib
from types import SimpleNamespace

import pytest

from mixed_gemm.compile import BuildSpec
from mixed_gemm.kernels.sm90a import Sm90aConfig, abi
from mixed_gemm.ops.packed import LayoutView
from mixed_gemm.kernels.sm90a import launch as L
from mixed_gemm.runtime import driver
from mixed_gemm.runtime import library as runtime_library
from mixed_gemm.runtime.library import LibraryMismatch


class FakeLib:
    def __init__(self, config, ws_bytes=0):
        self.c, self.ws_bytes, self.calls, self.next = config, ws_bytes, [], 100
        self.init_rc = self.run_rc = 0

    def info(self):
        c = self.c
        return dict(abi=abi.ABI_VERSION, params_bytes=2432, smem_bytes=1, threads=384, cluster_m=c.cluster[0],
                    cluster_n=c.cluster[1], stages=c.stages or 7, bits=c.bits, tile_m=c.tile[0],
                    tile_n=c.tile[1], tile_k=c.tile[2])

    def mg_prepare(self):
        return 0

    def mg_create(self):
        self.next += 1
        return self.next

    def mg_destroy(self, slot):
        pass

    def mg_workspace_bytes(self, *args):
        return self.ws_bytes

    def mg_init(self, slot, *args):
        self.calls.append(("init", slot, args[6], args[-2]))  # slot, M, workspace pointer
        return self.init_rc

    def mg_run(self, slot, x, y, stream):
        self.calls.append(("run", slot, x, y))
        return self.run_rc


class T:  # a tensor stand-in: data_ptr only
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


def _fake_library(monkeypatch, lib):
    """Every library the launcher opens is ``lib``; no CUDA context is touched."""
    monkeypatch.setattr(runtime_library, "get_library", lambda spec, bind: lib)
    monkeypatch.setattr(abi, "info", lambda lib_: lib_.info())
    monkeypatch.setattr(driver, "primary_context", lambda i: contextlib.nullcontext())


def _launcher(monkeypatch, schedule="t128x64x128_coop_c1x1_s0_split2", ws_bytes=0, ws_ptrs=None):
    cfg = Sm90aConfig.from_schedule(schedule)
    lib = FakeLib(cfg, ws_bytes)
    _fake_library(monkeypatch, lib)
    monkeypatch.setattr(L, "sm_count", lambda i: 132)
    ptrs = iter(ws_ptrs or [])
    state = {"ptr": next(ptrs, 0)}
    monkeypatch.setattr(L, "workspace", lambda dev, stream, floats: state["ptr"])
    return L.Sm90aLauncher(cfg, BuildSpec("name", None, (), "shared"), 0), lib, state, ptrs


def _weight(base=1000):
    view = LayoutView(T(base), T(base + 1), T(base + 2), 4096, (base, 4096))
    return SimpleNamespace(parts={"sm90a": view}, n=4096, k=4096, group_size=128)


def test_one_init_per_slot_then_retarget_only(monkeypatch):
    launch, lib, _, _ = _launcher(monkeypatch)
    w = _weight()
    launch(T(1), w, None, T(2), 100, 7)
    launch(T(3), w, None, T(4), 100, 7)          # same M: no rebuild
    launch(T(5), w, None, T(6), 120, 7)          # same bucket (128), new M: rebuild
    launch(T(5), w, None, T(6), 60, 7)           # another bucket: its own slot
    kinds = [(c[0], c[1]) for c in lib.calls]
    assert kinds == [("init", 101), ("run", 101), ("run", 101), ("init", 101), ("run", 101), ("init", 102),
                     ("run", 102)]
    assert [c[2:] for c in lib.calls if c[0] == "run"][:2] == [(1, 2), (3, 4)]  # the call's own x and y


def test_a_moved_workspace_rebuilds(monkeypatch):
    launch, lib, state, ptrs = _launcher(monkeypatch, ws_bytes=4096, ws_ptrs=[5000, 6000])
    w = _weight()
    launch(T(1), w, None, T(2), 64, 7)
    launch(T(1), w, None, T(2), 64, 7)
    state["ptr"] = next(ptrs)                    # the per-stream buffer grew (or a graph capture began)
    launch(T(1), w, None, T(2), 64, 7)
    inits = [c for c in lib.calls if c[0] == "init"]
    assert [c[3] for c in inits] == [5000, 6000]


def test_library_errors_name_the_config_and_reason(monkeypatch):
    launch, lib, _, _ = _launcher(monkeypatch)
    lib.init_rc = 11
    with pytest.raises(L.Sm90aLaunchError, match="t128x64x128_coop_c1x1_s0_split2: mg_init.*kInvalid"):
        launch(T(1), _weight(), None, T(2), 64, 7)
    lib.init_rc, lib.run_rc = 0, -6
    with pytest.raises(L.Sm90aLaunchError, match="mg_run: cudaLaunchKernelExC failed"):
        launch(T(1), _weight(2000), None, T(2), 64, 7)


def test_a_library_built_otherwise_is_refused(monkeypatch):
    cfg = Sm90aConfig.from_schedule("t128x64x128_coop_c1x1_s4_sk")
    lib = FakeLib(cfg)
    lib.info = lambda: dict(FakeLib(cfg).info(), stages=8)
    _fake_library(monkeypatch, lib)
    with pytest.raises(LibraryMismatch, match=r"built otherwise than its config says .*'stages': \(8, 4\)"):
        L.Sm90aLauncher(cfg, BuildSpec("name", None, (), "shared"), 0)
