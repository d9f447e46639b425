"""``primary_context`` synchronizes a device only on its first use (the context is made then), so
the launch paths that enter it later (an occupancy query per new launch shape) never host-sync and
can run under CUDA-graph capture. The driver and torch.cuda are faked: no GPU."""
from types import SimpleNamespace

from mixed_gemm.runtime import driver as drv_mod


def test_primary_context_synchronizes_a_device_once(monkeypatch):
    calls = []
    ok = SimpleNamespace(CUDA_SUCCESS=0)
    fake = SimpleNamespace(
        CUresult=ok,
        cuDeviceGet=lambda i: (0, f"dev{i}"),
        cuDevicePrimaryCtxRetain=lambda d: (calls.append(("retain", d)) or 0, f"ctx-{d}"),
        cuCtxPushCurrent=lambda c: (calls.append(("push", c)) or 0,),
        cuCtxPopCurrent=lambda: (calls.append(("pop",)) or 0, None),
        cuDevicePrimaryCtxRelease=lambda d: (calls.append(("release", d)) or 0,),
    )
    monkeypatch.setattr(drv_mod, "driver", lambda: fake)
    monkeypatch.setattr(drv_mod, "_LIVE", set())
    monkeypatch.setattr(drv_mod.torch.cuda, "init", lambda: calls.append(("init",)))
    monkeypatch.setattr(drv_mod.torch.cuda, "synchronize", lambda i=None: calls.append(("sync", i)))
    for device in (0, 0, 1, 0):
        with drv_mod.primary_context(device) as ctx:
            assert ctx == f"ctx-dev{device}"
    assert [c for c in calls if c[0] == "sync"] == [("sync", 0), ("sync", 1)]  # first use of each device only
    assert sum(c[0] == "push" for c in calls) == 4 and sum(c[0] == "pop" for c in calls) == 4
