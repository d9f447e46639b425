"""The tensor-parallel all-reduce on the CPU: which algorithm serves which size (and where NCCL
does), the kernels' configs, rendering and compilation, the custom ops' fake implementations, the
fallbacks a group that cannot use peer memory takes, and the unfused residual + RMSNorm against
transformers'. Two-GPU correctness and CUDA graphs: test_tp_allreduce_gpu.py."""
import os

import pytest
import torch
import torch.distributed as dist

from mixed_gemm.kernels.allreduce import (DATA_OFFSET, FAMILY, MAX_BLOCKS, ONE_SHOT_MAX_BYTES, AllReduceConfig, AllReduceProblem,
                                          buffer_bytes, check_mode, choose)
from mixed_gemm.kernels.allreduce.abi import ALLREDUCE_ARGS_BYTES
from mixed_gemm.ops import allreduce as ar

KB, MB = 1 << 10, 1 << 20
SLOT = 2 * MB


# ------------------------------------------------------------------ sizes -> algorithm
@pytest.mark.parametrize("nbytes", [2, 16 * KB, 256 * KB, MB, 2 * MB])
def test_two_ranks_take_one_shot_up_to_the_buffers(nbytes):
    assert choose(nbytes, 2, "auto", SLOT)[0] == "one_shot"


@pytest.mark.parametrize("world,small,large", [(4, 256 * KB, 256 * KB + 2), (8, 128 * KB, 128 * KB + 2),
                                               (3, 512 * KB, 512 * KB + 2)])
def test_more_ranks_switch_to_two_shot_above_the_table(world, small, large):
    assert choose(small, world, "auto", SLOT)[0] == "one_shot"
    assert choose(large, world, "auto", SLOT)[0] == "two_shot"
    assert ONE_SHOT_MAX_BYTES[world] == small


def test_nccl_beyond_the_buffers_the_ranks_and_when_forced():
    assert choose(SLOT + 2, 2, "auto", SLOT) == ("nccl", f"{SLOT + 2} bytes: above the {SLOT}-byte buffers "
                                                          "(MIXED_GEMM_ALLREDUCE_MAX_BYTES)")
    assert choose(SLOT + 2, 4, "two_shot", SLOT)[0] == "nccl"  # forcing an algorithm never exceeds the buffers
    assert choose(16 * KB, 9, "auto", SLOT)[0] == "nccl"
    assert choose(16 * KB, 2, "nccl", SLOT)[0] == "nccl"
    assert choose(16 * KB, 2, "two_shot", SLOT)[0] == "two_shot"
    assert choose(MB, 8, "one_shot", SLOT)[0] == "one_shot"


def test_modes_are_checked():
    assert check_mode("auto") == "auto"
    with pytest.raises(ValueError, match=r"all_reduce: must be one of \('auto', 'nccl', 'one_shot', 'two_shot', 'fused'\)"):
        choose(16, 2, "fast", SLOT)


def test_mode_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(ar.MODE_ENV, raising=False)
    assert ar.all_reduce_mode() == "auto"
    monkeypatch.setenv(ar.MODE_ENV, "NCCL")
    assert ar.all_reduce_mode() == "nccl" and ar.all_reduce_mode("one_shot") == "one_shot"
    monkeypatch.setenv(ar.MODE_ENV, "multicast")
    with pytest.raises(ValueError, match="all_reduce: must be one of"):
        ar.all_reduce_mode()


def test_multicast_stays_off():
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert os.environ["NVSHMEM_DISABLE_NVLS"] == "1"


# ------------------------------------------------------------------ configs
def test_config_names_rules_and_blocks():
    c = AllReduceConfig()
    assert c.kernel_name == "mg_allreduce_one_shot_f16_w2_t512" and c.schedule == "one_shot_t512"
    assert AllReduceConfig.from_schedule("two_shot_t256", dtype="bf16", world_size=4) == \
        AllReduceConfig("two_shot", "bf16", 4, 256)
    assert c.active_blocks(8192) == 2            # 16 KB: 1024 vectors, one per thread
    assert c.active_blocks(512 * 1024) == MAX_BLOCKS  # 1 MB: capped
    assert c.active_blocks(3) == 1
    assert AllReduceConfig("two_shot", world_size=4).active_blocks(8192 * 16) == 8
    assert AllReduceConfig("rms_norm").active_blocks(16 * 8192, rows=16) == 16
    assert AllReduceConfig("rms_norm").active_blocks(100 * 8192, rows=100) == MAX_BLOCKS
    assert buffer_bytes(2, SLOT) == DATA_OFFSET + 8 * SLOT == 90112 + 8 * SLOT  # + the GEMM-fused slots
    for kw, rule in [(dict(algo="three_shot"), "algo must be one of"), (dict(dtype="f8"), "dtype must be one of"),
                     (dict(world_size=1), r"world_size must be an int in \[2, 8\]"),
                     (dict(world_size=16), "world_size"), (dict(threads=100), "threads must be")]:
        with pytest.raises(ValueError, match=f"AllReduceConfig: {rule}"):
            AllReduceConfig(**kw)
    with pytest.raises(ValueError, match="schedule: expected '<algo>_t<threads>'"):
        AllReduceConfig.from_schedule("one_shot")


def test_can_implement():
    c = AllReduceConfig("one_shot", "f16", 2)
    assert FAMILY.can_implement(c, AllReduceProblem(8192, "f16", 2, SLOT)) == (True, "")
    ok, why = FAMILY.can_implement(c, AllReduceProblem(8192, "bf16", 2, SLOT))
    assert not ok and "is for f16 over 2 ranks, the problem is bf16 over 2" in why
    ok, why = FAMILY.can_implement(c, AllReduceProblem(SLOT, "f16", 2, SLOT))
    assert not ok and "do not fit" in why
    norm = AllReduceConfig("rms_norm", "f16", 2)
    assert FAMILY.can_implement(norm, AllReduceProblem(4 * 8192, "f16", 2, SLOT, rows=4, cols=8192))[0]
    ok, why = FAMILY.can_implement(norm, AllReduceProblem(4 * 100, "f16", 2, SLOT, rows=4, cols=100))
    assert not ok and "cols must be a positive multiple of 8" in why
    ok, why = FAMILY.can_implement(c, object())
    assert not ok and "AllReduceProblem" in why


def test_rendered_source_carries_its_mirrors():
    src = FAMILY.render(AllReduceConfig("rms_norm", "bf16", 4))
    assert "Kernel: mg_allreduce_rms_norm_bf16_w4_t512" in src
    assert f"sizeof(mixed_gemm::AllReduceArgs) == {ALLREDUCE_ARGS_BYTES}" in src
    assert "mixed_gemm::all_reduce_rms_norm<__nv_bfloat16, 4, 512>(args)" in src
    assert "kArDataOffset == 90112" in src and "kArChunkFlagsOffset == 8192" in src


@pytest.mark.nvcc
@pytest.mark.parametrize("config", [AllReduceConfig("one_shot", "f16", 2), AllReduceConfig("two_shot", "bf16", 8),
                                    AllReduceConfig("rms_norm", "f32", 4)], ids=lambda c: c.kernel_name)
def test_kernels_compile(tmp_cache, config):
    """The project's nvcc flags, sm_80 and sm_90 code (the static_asserts check the Python mirrors)."""
    from mixed_gemm.compile import build_spec, fatbin_targets, load_bytes

    targets = fatbin_targets(load_bytes(build_spec(FAMILY.build_spec(config))))
    assert targets == ["sm_80", "compute_90", "sm_90"]


# ------------------------------------------------------------------ custom ops
def test_fake_implementations_give_shapes():
    x = torch.empty(3, 5, 8192, dtype=torch.float16, device="meta")
    y = torch.ops.mixed_gemm.all_reduce(x, "0", "auto")
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    res = torch.empty_like(x)
    out, h = torch.ops.mixed_gemm.all_reduce_residual_rms_norm(x, res, torch.empty(8192, device="meta",
                                                                                  dtype=torch.float16), 1e-5, "0", "auto")
    assert out.shape == h.shape == x.shape and out.dtype == torch.float16


def test_fake_follows_the_unfused_type_promotion():
    """An fp32 norm weight over fp16 activations (the unfused path serves it): the fake must give
    the dtypes the real op returns, or compiled graphs would carry wrong metadata."""
    x, res, w = torch.randn(2, 64).half(), torch.randn(2, 64).half(), 1 + torch.randn(64)
    want_out, want_h = ar.residual_rms_norm(x, res, w, 1e-5)
    out, h = torch.ops.mixed_gemm.all_reduce_residual_rms_norm(x.to("meta"), res.to("meta"), w.to("meta"), 1e-5, "0",
                                                                 "auto")
    assert (out.dtype, h.dtype) == (want_out.dtype, want_h.dtype) == (torch.float32, torch.float16)


def test_ops_trace_with_fake_tensors():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, res, w):
        y = torch.ops.mixed_gemm.all_reduce(x, "0", "one_shot")
        return torch.ops.mixed_gemm.all_reduce_residual_rms_norm(y, res, w, 1e-6, "0", "auto")

    gm = make_fx(step, tracing_mode="fake")(torch.randn(2, 64).half(), torch.randn(2, 64).half(),
                                            torch.randn(64).half())
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.mixed_gemm.all_reduce.default in targets
    assert torch.ops.mixed_gemm.all_reduce_residual_rms_norm.default in targets


# ------------------------------------------------------------------ fallbacks
@pytest.fixture
def gloo_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield dist.group.WORLD
    ar.release_all_reduce()
    dist.destroy_process_group()


def test_a_group_without_cuda_or_nccl_is_nccl_only(gloo_world):
    comm = ar.Communicator(gloo_world, device="cpu")
    assert not comm.usable and comm.reason == "cpu is not a CUDA device"
    assert comm.algorithm(torch.ones(8, dtype=torch.float16)) == ("nccl", "cpu is not a CUDA device")
    ok, why = ar._local_verdict(gloo_world, torch.device("cuda", 0), 1)
    assert not ok and "1 ranks: ours serves 2 to 8" in why
    ok, why = ar._local_verdict(gloo_world, torch.device("cuda", 0), 2)
    assert not ok and "backend is 'gloo', not NCCL" in why


def test_cpu_layers_keep_gloo(gloo_world):
    from mixed_gemm.nn.parallel import all_reduce_residual_rms_norm, tensor_parallel_all_reduce

    x = torch.randn(4, 64)
    assert torch.equal(tensor_parallel_all_reduce(x.clone(), mode="auto"), x)  # one rank: the sum is x
    res, w = torch.randn(4, 64), torch.randn(64)
    out, h = all_reduce_residual_rms_norm(x, res, w, 1e-5)
    want = ar.residual_rms_norm(x, res, w, 1e-5)
    assert torch.equal(out, want[0]) and torch.equal(h, want[1])


class _SymmMem:
    """Stands in for torch.distributed._symmetric_memory: rendezvous fails ``failures`` times with
    ``message``, then returns a handle whose buffer_ptrs are the blocks' bases."""

    def __init__(self, message, failures=1):
        self.message, self.failures, self.calls = message, failures, []

    def rendezvous(self, buf, name):
        self.calls.append(("rendezvous", name))
        if self.failures:
            self.failures -= 1
            raise RuntimeError(self.message)
        return type("Handle", (), {"buffer_ptrs": [buf.data_ptr() - 64, 4096], "buffer_size": buf.numel() + 64})()

    def enable_symm_mem_for_group(self, name):
        self.calls.append(("enable", name))


def _use_symm_mem(monkeypatch, stub):
    import sys

    monkeypatch.setattr(dist, "_symmetric_memory", stub, raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed._symmetric_memory", stub)


def test_rendezvous_registers_the_group_only_where_torch_asks_for_it(monkeypatch):
    buf = torch.empty(256, dtype=torch.uint8)
    old = _SymmMem("get_group_info: no group info associated with the group name 0")
    _use_symm_mem(monkeypatch, old)
    handle, bases, offset = ar._rendezvous(buf, "0", 0)
    assert old.calls == [("rendezvous", "0"), ("enable", "0"), ("rendezvous", "0")]
    assert bases == [buf.data_ptr() - 64, 4096] and offset == 64
    other = _SymmMem("CUDA driver error: invalid device ordinal")  # may come after part of the exchange
    _use_symm_mem(monkeypatch, other)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        ar._rendezvous(buf, "0", 0)
    assert other.calls == [("rendezvous", "0")]  # no second, unpaired rendezvous


def test_failures_are_described_in_one_line():
    assert ar._why(RuntimeError()) == "RuntimeError: "
    assert ar._why(ValueError("first\nsecond")) == "ValueError: first"


def test_ranks_with_different_slot_sizes_stay_on_nccl(monkeypatch):
    comm = ar.Communicator.__new__(ar.Communicator)
    comm.group, comm.rank, comm.world_size, comm.slot_bytes = None, 0, 2, SLOT
    comm.device, comm.reason, comm.usable = torch.device("cuda", 0), "", False
    monkeypatch.setattr(ar, "_local_verdict", lambda group, device, world: (True, ""))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: _props("GPU-0"))
    exchanged = []

    def gather(obj, group):
        exchanged.append(obj)
        return [obj, dict(obj, uuid="GPU-1", slot_bytes=SLOT // 2)]

    monkeypatch.setattr(ar, "_gather", gather)
    comm._setup()
    assert not comm.usable and len(exchanged) == 1  # decided at the first exchange, on every rank alike
    assert "rank 1: MIXED_GEMM_ALLREDUCE_MAX_BYTES gives 1048576-byte slots" in comm.reason


def _props(uuid):
    return type("Props", (), {"uuid": uuid})()


def test_peer_checks(monkeypatch):
    infos = [dict(host="a", uuid="GPU-0"), dict(host="a", uuid="GPU-1")]
    dev = torch.device("cuda", 0)
    ok, why = ar._peer_verdict(dev, [dict(host="a", uuid="GPU-0"), dict(host="b", uuid="GPU-1")], 0)
    assert not ok and "spans several hosts" in why
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: _props(f"GPU-{d}"))
    ok, why = ar._peer_verdict(dev, infos, 0)
    assert not ok and "rank 1's GPU is not visible to rank 0" in why
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: False)
    ok, why = ar._peer_verdict(dev, infos, 0)
    assert not ok and "GPU 0 cannot access rank 1's GPU 1 (no NVLink/P2P path)" in why
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: True)
    assert ar._peer_verdict(dev, infos, 0) == (True, "")


# ------------------------------------------------------------------ residual + RMSNorm
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unfused_residual_rms_norm_is_transformers(dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(256, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(256))
    x, res = torch.randn(5, 256).to(dtype), torch.randn(5, 256).to(dtype)
    out, h = ar.residual_rms_norm(x, res, norm.weight.detach(), 1e-5)
    assert torch.equal(h, res + x)
    assert torch.equal(out, norm(res + x).detach())
    assert transformers  # imported for its norm


# ------------------------------------------------------------------ launch glue (no GPU: a recording launcher)
class _Recorder:
    """Stands in for a loaded kernel: records each launch's argument block."""

    def __init__(self, algo, calls):
        from mixed_gemm.kernels.allreduce.abi import AllReduceArgs

        self.config = AllReduceConfig(algo, "f16", 2)
        self.fn = type("Fn", (), {"lock": __import__("threading").Lock()})()
        self.args, self.calls = AllReduceArgs(), calls

    def launch(self, argv, stream):
        a = self.args
        self.calls.append(dict(algo=self.config.algo, in_=a.in_, out=a.out, numel=a.numel, rows=a.rows, cols=a.cols,
                               blocks=a.active_blocks, residual=a.residual, weight=a.weight, eps=a.eps))


def _fake_comm(monkeypatch, calls):
    """A communicator of two ranks on the CPU whose kernels record their launches."""
    comm = ar.Communicator.__new__(ar.Communicator)
    comm.usable, comm.reason, comm.world_size, comm.slot_bytes = True, "", 2, SLOT
    comm.device, comm.group = torch.device("cpu"), None
    launchers = [_Recorder(a, calls) for a in ("one_shot", "two_shot", "rms_norm")]
    comm._kernels = {"f16": {ln.config.algo: (ln, ln.args, 0) for ln in launchers}}
    monkeypatch.setattr(ar, "current_stream", lambda index: 0)
    monkeypatch.setattr(comm, "algorithm", lambda x, mode="auto": choose(x.numel() * x.element_size(), 2, mode, SLOT))
    monkeypatch.setattr(comm, "_ready", lambda dtype: comm._kernels.get(ar._NAMES.get(dtype)))
    return comm


def test_calls_fill_the_argument_block(monkeypatch):
    calls = []
    comm = _fake_comm(monkeypatch, calls)
    x = torch.randn(16, 8192).half()
    assert comm.all_reduce_(x) is x
    assert calls[-1] == dict(algo="one_shot", in_=x.data_ptr(), out=x.data_ptr(), numel=x.numel(), rows=1, cols=0,
                             blocks=32, residual=None, weight=None, eps=0.0)
    y = comm.all_reduce(x, "two_shot")
    assert calls[-1]["algo"] == "two_shot" and calls[-1]["out"] == y.data_ptr() and calls[-1]["in_"] == x.data_ptr()
    view = torch.randn(8193).half()[1:]  # 2 bytes off 16-byte alignment: summed through an aligned copy
    comm.all_reduce_(view)
    assert calls[-1]["in_"] != view.data_ptr() and calls[-1]["in_"] % 16 == 0 and calls[-1]["numel"] == 8192
    n = len(calls)
    comm.all_reduce_(torch.empty(0, dtype=torch.float16))
    assert len(calls) == n  # nothing to sum: no launch (on every rank alike)
    res, w = torch.randn(16, 8192).half(), torch.randn(8192).half()
    assert not comm._fused_applies(x, res, w, 8192, "nccl") and not comm._fused_applies(x, res, w, 8192, "two_shot")
    assert not comm._fused_applies(x, res, w.float(), 8192, "auto")
    assert not comm._fused_applies(x.float(), res.float(), w.float(), 8192, "auto")  # no f32 kernels loaded here
    out, h = comm.all_reduce_residual_rms_norm(x, res, w, 1e-5)
    c = calls[-1]
    assert (c["algo"], c["rows"], c["cols"], c["blocks"], c["residual"], c["weight"]) == \
        ("rms_norm", 16, 8192, 16, res.data_ptr(), w.data_ptr())
    assert abs(c["eps"] - 1e-5) < 1e-12 and c["out"] == out.data_ptr()
