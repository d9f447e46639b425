"""The row-parallel GEMM fused with its all-reduce, without a GPU: the sizes-only choice, the gemv
configuration each rank runs, the compiled identity and its rendering, the agreement between
ranks, the layer's switch and the custom op's fake. The kernels themselves:
test_tp_allreduce_emulated_gpu.py (one GPU) and test_tp_allreduce_gpu.py (two)."""
from types import SimpleNamespace

import pytest
import torch

from mixed_gemm.kernels import Problem
from mixed_gemm.kernels.allreduce import FUSED, GEMM_FUSED_MAX_M, MODES, choose, choose_gemm_fused
from mixed_gemm.kernels.allreduce.config import CHUNK, MAX_CHUNKS
from mixed_gemm.kernels.allreduce.gemv import (FAMILY, GEMV_AR_ARGS_BYTES, SM80_SCHEDULE, GemvAllReduceArgs,
                                               GemvAllReduceConfig, gemv_config_for, reducers_for)
from mixed_gemm.kernels.gemv import FAMILY as GEMV
from mixed_gemm.kernels.gemv.abi import GEMV_ARGS_BYTES
from mixed_gemm.kernels.gemv.config import GemvConfig
from mixed_gemm.ops import allreduce as ar
from mixed_gemm.ops import gemm_allreduce as gar

SLOT = 2 << 20
H = 8192


def _problem(m, n=H, k=14336, layout="sm80+sm90a", bits=4, dtype="f16"):
    return Problem(m=m, n=n, k=k, dtype=dtype, bits=bits, zero_mode="int", group_size=128, layout=layout)


# ------------------------------------------------------------------ the choice (sizes only)
@pytest.mark.parametrize("world", range(2, 9))
@pytest.mark.parametrize("m", [1, 2, 16, 32])
def test_decode_sizes_fuse_at_every_group_size(world, m):
    assert choose_gemm_fused(m, H, world, "f16", "sm80+sm90a", 4, FUSED, SLOT) == \
        (True, "GEMM fused with the all-reduce (gemv epilogue pushes, last grid row reduces)")


def test_the_fused_kernel_is_opt_in_and_falls_back_outside_its_sizes():
    assert "fused" in MODES
    for mode in ("auto", "nccl", "one_shot", "two_shot"):
        ok, why = choose_gemm_fused(1, H, 2, "f16", "sm90a", 4, mode, SLOT)
        assert not ok and "opt-in" in why
    cases = [
        (dict(m=GEMM_FUSED_MAX_M + 1), "M=33: the gemv kernels of a sm80+sm90a 4-bit weight take 1 to 32 rows"),
        (dict(m=64), "take 1 to 32 rows"),
        (dict(m=0), "take 1 to 32 rows"),
        (dict(world=1), "1 ranks: ours serves 2 to 8"),
        (dict(world=9), "9 ranks"),
        (dict(dtype="f32"), "f32: the gemv kernels take f16 and bf16"),
        (dict(n=H + 4), "N=8196: the fused kernel takes multiples of 8 up to 16384"),
        (dict(n=MAX_CHUNKS * CHUNK + 8), "up to 16384"),
        (dict(m=32, slot=32 * H), "M=32: the fused slots hold 16384 outputs per row, 1048576 bytes, above the "
                                  "262144-byte buffers"),
        (dict(m=16, n=1024, slot=16 * 2 * 1024), "524288 bytes"),  # a row is 16384 outputs whatever N
        (dict(layout="sm80", m=17), "take 1 to 16 rows"),
        (dict(layout="lowbit", bits=2, m=9), "take 1 to 8 rows"),
    ]
    for kw, why in cases:
        args = dict(m=1, n=H, world=2, dtype="f16", layout="sm80+sm90a", bits=4, slot=SLOT)
        args.update(kw)
        ok, reason = choose_gemm_fused(args["m"], args["n"], args["world"], args["dtype"], args["layout"], args["bits"],
                                       FUSED, args["slot"])
        assert not ok and why in reason, (kw, reason)
    assert choose_gemm_fused(32, H, 2, "bf16", "lowbit", 7, FUSED, SLOT)[0]  # 1:2-sparse: gemv up to 32
    assert choose_gemm_fused(16, H, 2, "f16", "sm80", 4, FUSED, SLOT)[0]    # the sm80-layout gemv
    with pytest.raises(ValueError, match="all_reduce: must be one of"):
        choose_gemm_fused(1, H, 2, "f16", "sm90a", 4, "fast", SLOT)


def test_fused_mode_sums_the_other_all_reduces_like_auto():
    for nbytes, world in ((16 << 10, 2), (1 << 20, 4), (4 << 20, 2)):
        assert choose(nbytes, world, FUSED, SLOT)[0] == choose(nbytes, world, "auto", SLOT)[0]


# ------------------------------------------------------------------ the gemv configuration (per rank)
def test_the_selected_gemv_config_is_kept_so_results_match_the_unfused_path():
    chosen = GemvConfig.from_schedule("m8_s1_w2x8_u8", bits=4).replace(splits=3)
    assert gemv_config_for(_problem(8), 132, chosen) == chosen
    heuristic = gemv_config_for(_problem(8), 132, None)
    assert heuristic == GEMV.heuristic(_problem(8), 132) and heuristic.tokens == 8
    # sm80 tiles chosen above M=8 (a weight with both copies): the sm90a gemv row of the table
    at16 = gemv_config_for(_problem(16), 132, None)
    assert at16.layout == "sm90a" and at16.tokens == 16 and at16.splits >= 1
    at32 = gemv_config_for(_problem(32, bits=8), 132, None)
    assert at32.tokens == 32 and at32.unroll == 2  # int8 halves the unroll, as the heuristics do
    sm80 = gemv_config_for(_problem(16, layout="sm80"), 108, None)
    assert sm80.schedule.startswith(SM80_SCHEDULE) and sm80.layout == "sm80"
    assert gemv_config_for(_problem(9, layout="lowbit", bits=2), 132, None) is None
    # a chosen config too small for M, or of another layout, is not taken
    assert gemv_config_for(_problem(16), 132, chosen).tokens == 16


def test_configs_whose_shared_memory_would_overflow_are_replaced():
    big = GemvConfig.from_schedule("m16_s1_w1x8_u16_xs", bits=4)  # x stages above 48 KB: dynamic
    assert big.dynamic_smem and GemvAllReduceConfig.fits(big)
    static = GemvConfig.from_schedule("m16_s2_w4x2_u8_xs", bits=4)
    assert GemvAllReduceConfig.fits(static) == (static.smem_bytes + 16 * 128 * 2 + 1024 <= 48 * 1024)
    with pytest.raises(ValueError, match="GemvAllReduceConfig: world_size must be an int in"):
        GemvAllReduceConfig(static, 1)
    with pytest.raises(ValueError, match="gemv must be a GemvConfig"):
        GemvAllReduceConfig("m8_s2_w4x2_u8", 2)


# ------------------------------------------------------------------ the compiled identity
def test_names_fold_the_splits_and_carry_the_world_size():
    g = GemvConfig.from_schedule("m8_s2_w4x2_u8", dtype="bf16", bits=4).replace(splits=4)
    c = GemvAllReduceConfig(g, 4)
    assert c.kernel_name == "mg_gemvar4_bf16_u4_m8_s2_w4x2_u8" and c.kernel.gemv.splits == 1
    assert c.name == "mg_gemvar4_bf16_u4_zint_m8_s2_w4x2_u8_split4" and c.schedule == "m8_s2_w4x2_u8_split4"
    assert (c.dtype, c.bits, c.zero_mode) == ("bf16", 4, "int")
    assert GemvAllReduceConfig(g, 8).kernel_name != c.kernel_name


def test_rendered_source_runs_the_fused_epilogue_and_checks_its_mirrors():
    g = GemvConfig.from_schedule("m16_s2_w4x2_u8", bits=4)
    src = FAMILY.render(GemvAllReduceConfig(g, 3))
    assert '#include "allreduce/gemv_allreduce.cuh"' in src
    assert f"sizeof(mixed_gemm::GemvAllReduceArgs) == {GEMV_AR_ARGS_BYTES}" in src
    assert f"sizeof(mixed_gemm::GemvArgs) == {GEMV_ARGS_BYTES}" in src
    assert "mixed_gemm::kArChunk == 16" in src and "mixed_gemm::kArDataOffset == 90112" in src
    assert "mg_gemvar3_f16_u4_m16_s2_w4x2_u8(mixed_gemm::GemvAllReduceArgs const args)" in src
    assert "mixed_gemm::GemvAllReduce<Kernel, 3, 16>::run(args, smem);" in src
    plain = GEMV.render(g)  # the gemv kernels' sources are untouched (their cache keys stay)
    assert "GemvAllReduce" not in plain and "(mixed_gemm::GemvArgs const args)" in plain
    assert "  Kernel::run(args, smem);\n}" in plain


def test_argument_block_layout():
    assert GemvAllReduceArgs.gemv.offset == 0 and GemvAllReduceArgs.peers.offset == GEMV_ARGS_BYTES == 112
    assert GEMV_AR_ARGS_BYTES == 200


def test_can_implement():
    c = GemvAllReduceConfig(GemvConfig.from_schedule("m8_s2_w4x2_u8", bits=4), 2)
    assert FAMILY.can_implement(c, _problem(8)) == (True, "")
    ok, why = FAMILY.can_implement(c, _problem(16))
    assert not ok and "serves at most 8 rows of x" in why
    ok, why = FAMILY.can_implement(c, _problem(8, n=H + 4))
    assert not ok and "N must be a multiple of 8" in why


def test_reducers_take_at_most_half_the_sms():
    assert reducers_for(64, 132) == 64 and reducers_for(128, 132) == 66 and reducers_for(512, 58) == 29
    assert reducers_for(1, 132) == 1 and reducers_for(8, 1) == 1
    # ranks sharing one GPU (emulated) share its half: 2 x 33, 5 x 13 of 132 SMs
    assert reducers_for(512, 132, 2) == 33 and reducers_for(512, 132, 5) == 13 and reducers_for(8, 4, 4) == 1


@pytest.mark.nvcc
@pytest.mark.parametrize("schedule,world,dtype,bits", [("m8_s2_w4x2_u8", 2, "f16", 4), ("m32_s1_w4x2_u4", 8, "bf16", 4),
                                                       ("m1_s2_w4x2_u8", 3, "f16", 4),
                                                       ("m16_s1_w4x2_u4_xs_sm80", 2, "f16", 4)])
def test_kernels_compile(tmp_cache, schedule, world, dtype, bits):
    """The project's nvcc flags, sm_80 and sm_90 code (the static_asserts check the Python mirrors)."""
    from mixed_gemm.compile import build_spec, fatbin_targets, load_bytes

    config = GemvAllReduceConfig(GemvConfig.from_schedule(schedule, dtype=dtype, bits=bits), world)
    assert fatbin_targets(load_bytes(build_spec(FAMILY.build_spec(config)))) == ["sm_80", "compute_90", "sm_90"]


# ------------------------------------------------------------------ agreement between ranks
class _Weight:
    """The fields of a PackedWeight the plan reads."""

    def __init__(self, n=H, k=14336, layout="sm80+sm90a"):
        self.n, self.k, self.bits, self.zero_mode, self.group_size, self.layout = n, k, 4, "int", 128, layout
        self.kernel_dtype, self.signature = "f16", ("sig", n, k)
        self.device = torch.device("cuda", 0)


def _comm(world=2):
    comm = ar.Communicator.__new__(ar.Communicator)
    comm.usable, comm.reason, comm.world_size, comm.slot_bytes, comm.rank = True, "", world, SLOT, 0
    comm.device, comm.group, comm.same_arch, comm.gemm_fused = torch.device("cpu"), None, True, {}
    return comm


@pytest.fixture
def plan(monkeypatch):
    """fused_plan with recorded exchanges and launchers; ``peer_fails`` makes rank 1 fail to load."""
    state = dict(exchanges=[], peer_fails="", loads=[], capturing=False)

    def gather(obj, group):
        state["exchanges"].append(obj)
        return [obj, state["peer_fails"]]

    class _Choice:
        family = GEMV
        config = None

    monkeypatch.setattr(gar, "_gather", gather)
    monkeypatch.setattr(gar, "_capturing", lambda: state["capturing"])
    monkeypatch.setattr(gar, "selected", lambda sig, bucket, prob, index: _Choice())
    monkeypatch.setattr(gar, "problem", lambda w, m: _problem(m, w.n, w.k, w.layout))
    monkeypatch.setattr(gar.FAMILY, "launcher", lambda config, index: state["loads"].append(config) or config)
    monkeypatch.setattr(torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    return state


def test_ranks_agree_once_per_problem_then_look_it_up(plan):
    comm, w = _comm(), _Weight()
    launcher, why = gar.fused_plan(comm, w, 5, FUSED)
    assert isinstance(launcher, GemvAllReduceConfig) and launcher.gemv.tokens == 8 and "fused" in why
    assert plan["exchanges"] == [""] and len(plan["loads"]) == 1
    assert gar.fused_plan(comm, w, 7, FUSED)[0] is launcher  # same bucket (8): no exchange
    assert len(plan["exchanges"]) == 1
    gar.fused_plan(comm, w, 9, FUSED)  # bucket 16: a new problem, agreed once more
    assert len(plan["exchanges"]) == 2


def test_a_rank_that_cannot_load_keeps_every_rank_unfused(plan):
    plan["peer_fails"] = "RuntimeError: nvcc not found"
    comm, w = _comm(), _Weight()
    assert gar.fused_plan(comm, w, 1, FUSED) == (None, "fused kernel: rank 1: RuntimeError: nvcc not found")
    assert gar.fused_plan(comm, w, 1, FUSED)[0] is None and len(plan["exchanges"]) == 1  # remembered


def test_a_tile_selection_keeps_the_problem_unfused(plan, monkeypatch):
    class _Tile:
        family = SimpleNamespace(name="sm90s")
        config = None

    monkeypatch.setattr(gar, "selected", lambda sig, bucket, prob, index: _Tile())
    launcher, why = gar.fused_plan(_comm(), _Weight(), 16, FUSED)
    assert launcher is None and "selection runs the sm90s family at M=16" in why
    assert plan["exchanges"] == [why.partition("rank 0: ")[2]] and plan["loads"] == []  # agreed, nothing loaded


def test_capture_without_an_eager_call_stays_unfused_on_every_rank(plan):
    plan["capturing"] = True
    launcher, why = gar.fused_plan(_comm(), _Weight(), 1, FUSED)
    assert launcher is None and "not prepared before CUDA-graph capture" in why and plan["exchanges"] == []


def test_unusable_groups_and_mixed_gpus_stay_unfused(plan):
    comm = _comm()
    comm.usable, comm.reason = False, "rank 1: no NVLink/P2P path"
    assert gar.fused_plan(comm, _Weight(), 1, FUSED) == (None, "rank 1: no NVLink/P2P path")
    comm = _comm()
    comm.same_arch = False
    assert "differ in compute capability" in gar.fused_plan(comm, _Weight(), 1, FUSED)[1]
    assert "opt-in" in gar.fused_plan(_comm(), _Weight(), 1, "auto")[1]
    assert "take 1 to 32 rows" in gar.fused_plan(_comm(), _Weight(), 64, FUSED)[1]
    assert plan["exchanges"] == []


# ------------------------------------------------------------------ layer and op
def test_layer_switch(monkeypatch):
    from mixed_gemm.nn.parallel import RowParallelQuantLinear
    from mixed_gemm.nn.quant_linear import QuantLinear

    lin = QuantLinear(256, 64, bits=4, group_size=128)
    assert not RowParallelQuantLinear(lin, tp_rank=0, tp_size=1).fuse_all_reduce
    assert RowParallelQuantLinear(lin, tp_rank=0, tp_size=1, fuse_all_reduce=True).fuse_all_reduce
    assert RowParallelQuantLinear(lin, tp_rank=0, tp_size=1, all_reduce="fused").fuse_all_reduce
    monkeypatch.setenv("MIXED_GEMM_ALLREDUCE", "fused")
    layer = RowParallelQuantLinear(lin, tp_rank=0, tp_size=1)
    assert layer.fuse_all_reduce and "fuse_all_reduce=True" in repr(layer)
    with pytest.raises(TypeError, match="fuse_all_reduce: expected a bool or None"):
        RowParallelQuantLinear(lin, tp_rank=0, tp_size=1, fuse_all_reduce="yes")
    x = torch.randn(3, 256).half()
    # one rank (CPU): no communication, the plain layer
    torch.testing.assert_close(layer(x), lin(x), rtol=0, atol=0, equal_nan=True)


def test_fake_gives_the_output_shape():
    x = torch.empty(2, 3, 1792, dtype=torch.float16, device="meta")
    b = torch.empty(1, dtype=torch.int32, device="meta")
    y = torch.ops.mixed_gemm.gemm_all_reduce(x, b, b, None, None, None, H, 1792, 4, 128, "int", "sm90a", [], None,
                                             "0", FUSED)
    assert y.shape == (2, 3, H) and y.dtype == torch.float16
