"""moe_gemv's programmatic dependent launch (CPU, the kernel faked): which launchers may launch with
PDL (the down projection's two-launch kernels on sm_90+) and which do by default (pair mode's), that
``pdl=True`` reaches the launch and ``pdl_prefetch=True`` the argument block's ``pdl`` field (the
kernel's L2 prefetch) in pair, expert and persistent mode, and that a kernel which does not wait
refuses it before anything launches."""
import pytest
import torch

from mixed_gemm.kernels.moe_gemv import MoeGemvConfig
from mixed_gemm.kernels.moe_gemv import launch as launch_mod
from mixed_gemm.kernels.moe_gemv.launch import MoeGemvLauncher
from test_moe_gemv_config import _call_args, _experts, _fake_launcher, _FakeKernel

E, H, INTER = 8, 256, 128
MODES = {"pair": dict(), "pair_split_kloop": dict(splits=2, slot_loop=True),
         "expert": dict(tokens=16, by_expert=True), "persistent": dict(tokens=8, persistent=True, splits=2)}


@pytest.fixture
def faked(monkeypatch):
    monkeypatch.setattr(launch_mod, "workspace", lambda dev, stream, n: 4096)
    monkeypatch.setattr(launch_mod, "semaphores", lambda dev, stream, n: 8192)
    monkeypatch.setattr(launch_mod, "sm_count", lambda dev: 132)


def _launcher(config, capable=True):
    launcher, fake = _fake_launcher(config)
    launcher._resident, launcher._persistent = {}, {}
    launcher.pdl_capable = capable
    fake.occupancy = lambda smem: 2
    return launcher, fake


@pytest.mark.parametrize("mode", list(MODES))
def test_down_launch_passes_pdl_and_sets_the_prefetch_field(faked, mode):
    config = MoeGemvConfig(stage="w2", strips=1, warps=(4, 2), **MODES[mode])
    launcher, fake = _launcher(config)
    w = _experts(H, INTER, layout="sm90a", e=E, group=64)
    tokens, top_k = 3, 2
    x, ids, weights, out = _call_args("w2", tokens, top_k, INTER, H, INTER)
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0)
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0, pdl=True)
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0, pdl=True, pdl_prefetch=True)
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0, pdl_prefetch=True)  # no PDL: nothing to prefetch for
    launcher(x, w, ids, weights, out, tokens, top_k, stream=0)
    assert fake.pdl == [False, True, True, False, False]
    assert [fields["pdl"] for _, fields in fake.launches] == [0, 0, 1, 0, 0]
    assert len({grid for grid, _ in fake.launches}) == 1  # the same grid with and without


@pytest.mark.parametrize("config", [MoeGemvConfig(stage="w13", strips=1, warps=(4, 2)),
                                    MoeGemvConfig(stage="w2", strips=1, warps=(4, 2))],
                         ids=["gate_up", "down_not_capable"])
def test_a_kernel_that_does_not_wait_refuses_pdl_before_launching(faked, config):
    launcher, fake = _launcher(config, capable=False)
    n, k = (2 * INTER, H) if config.gated else (H, INTER)
    w = _experts(n, k, layout="sm90a", e=E, group=64)
    x, ids, weights, out = _call_args(config.stage, 2, 2, k, H, INTER)
    with pytest.raises(ValueError, match=r"^pdl: only the down projection's two-launch kernels on sm_90\+"):
        launcher(x, w, ids, weights, out, 2, 2, stream=0, pdl=True)
    assert fake.launches == []


@pytest.mark.parametrize("capability, stage, fused, want", [
    ((9, 0), "w2", False, True), ((10, 0), "w2", False, True), ((8, 0), "w2", False, False),
    (None, "w2", False, False), ((9, 0), "w13", False, False), ((9, 0), "w2", True, False)])
def test_pdl_capable_is_the_down_stage_of_two_launches_on_sm90(monkeypatch, capability, stage, fused, want):
    class Module:
        def function(self, name, args, threads, smem):
            return _FakeKernel()

    monkeypatch.setattr(launch_mod, "get_module", lambda spec, dev: Module())
    monkeypatch.setattr(launch_mod, "compute_capability", lambda dev: capability)
    tiled = dict(tokens=8, persistent=True, fused=True) if fused else {}
    config = MoeGemvConfig(stage=stage, strips=1, warps=(4, 2), **tiled)
    launcher = MoeGemvLauncher(config, None, 0)
    assert launcher.pdl_capable is want
    assert launcher.pdl_default is want  # pair mode: the measured default


@pytest.mark.parametrize("mode", ["expert", "persistent"])
def test_pdl_is_not_the_default_of_expert_and_persistent_mode(monkeypatch, mode):
    """Capable, but not measured faster with PDL: run_grouped launches them plainly unless told otherwise."""
    class Module:
        def function(self, name, args, threads, smem):
            return _FakeKernel()

    monkeypatch.setattr(launch_mod, "get_module", lambda spec, dev: Module())
    monkeypatch.setattr(launch_mod, "compute_capability", lambda dev: (9, 0))
    launcher = MoeGemvLauncher(MoeGemvConfig(stage="w2", strips=1, warps=(4, 2), **MODES[mode]), None, 0)
    assert launcher.pdl_capable and not launcher.pdl_default


def test_the_one_launch_mode_never_sets_the_prefetch_field(faked):
    """launch_layer (both projections in one kernel, no second launch) leaves ``pdl`` at 0 in both blocks."""
    from test_moe_gemv_config import _FakeFusedKernel

    up = MoeGemvConfig(stage="w13", strips=1, warps=(4, 2), tokens=8, persistent=True, fused=True)
    launcher, fake = _fake_launcher(up, _FakeFusedKernel())
    launcher._resident, launcher._persistent = {}, {}
    fake.occupancy = lambda smem: 2
    down, _ = _fake_launcher(up.replace(stage="w2"))
    w13 = _experts(2 * INTER, H, layout="sm90a", e=E, group=64)
    w2 = _experts(H, INTER, layout="sm90a", e=E, group=64, seed=1)
    tokens, top_k = 2, 2
    x = torch.zeros(tokens, H, dtype=torch.float16)
    h, y = torch.zeros(tokens * top_k, INTER, dtype=torch.float16), torch.zeros(tokens, H, dtype=torch.float16)
    ids, weights = torch.zeros(tokens, top_k, dtype=torch.int64), torch.ones(tokens, top_k)
    launcher.launch_layer(down, x, w13, w2, ids, weights, h, y, tokens, top_k, 0)
    (_, _, _, fields), = fake.launches
    assert fields["up"]["pdl"] == fields["down"]["pdl"] == 0
