"""Soak on the GPU (each test well under a minute on an H100; nothing here is timed):

- 100k ``matmul`` calls across the M buckets 1, 16, 64 and 256, half into ``out=`` and half
  allocating: host RSS, torch's allocated memory and the device's free memory stay flat after a
  warm-up, and every call returns the same bits (the first result matches the float32 reference).
- A decode step (two QuantLinear layers at M=1, SiLU between them, the skip connection in the
  second's epilogue) captured in a CUDA graph and replayed 10k times, its input switching between
  two tokens: every replay writes exactly the eager step's output for its token.
"""
from __future__ import annotations

import gc
import os

import pytest
import torch

import mixed_gemm as mg
from tolerance import assert_elementwise
from weights import random_weight, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MiB = 2**20
CALLS, WARMUP = 100_000, 4_000
MS = (1, 16, 64, 256)
REPLAYS = 10_000


def _rss() -> int:
    """This process's resident set in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _device_used() -> int:
    """Device memory this process holds: the device's whole use when the process is alone on the GPU
    (memory taken outside torch's allocator counts too); under pytest-xdist, where other workers
    allocate beside it, only what torch's allocator reserved."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        return torch.cuda.memory_reserved()
    free, total = torch.cuda.mem_get_info()
    return total - free


def test_100k_matmul_calls_keep_memory_flat_and_results_identical():
    n, k, g = 1024, 1024, 128  # small: the soak is about the host path, not GPU time
    (q, s, z), packed = random_weight(n, k, fmt="awq", bits=4, symmetric=False, group_size=g, device="cuda",
                                      seed=seed_of("soak"))
    w = mg.prepack(*packed, format="awq", bits=4, group_size=g)
    xs = {m: torch.randn(m, k, device="cuda").half() for m in MS}
    outs = {m: torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16) for m in MS}
    first = {m: mg.matmul(xs[m], w) for m in MS}
    torch.cuda.synchronize()
    for m in MS:
        assert_elementwise(first[m], mg.reference.matmul(xs[m], q, s, z, group_size=g, bits=4), k)
    mismatches = torch.zeros((), dtype=torch.int32, device="cuda")

    def burst(calls: int) -> None:
        for i in range(calls):
            m = MS[i % len(MS)]
            if (i // len(MS)) % 2:  # every M both ways, in alternate rounds
                mg.matmul(xs[m], w, out=outs[m])
            else:
                y = mg.matmul(xs[m], w)
                if i % 1000 < len(MS):  # each M once every 1000 calls, counted on the GPU (no host sync)
                    mismatches.add_((y != first[m]).any().int())

    burst(WARMUP)
    torch.cuda.synchronize()
    gc.collect()
    rss, allocated, used = _rss(), torch.cuda.memory_allocated(), _device_used()
    burst(CALLS)
    torch.cuda.synchronize()
    gc.collect()
    rss_growth = _rss() - rss
    allocated_growth = torch.cuda.memory_allocated() - allocated
    device_growth = _device_used() - used
    # A leak of one small Python object per call would be megabytes here; device memory is taken
    # in 2 MiB pages, so one page of slack.
    assert rss_growth < 2 * MiB, f"host RSS grew {rss_growth / MiB:.2f} MiB over {CALLS} calls"
    assert allocated_growth < 1 * MiB, f"torch.cuda.memory_allocated grew {allocated_growth / MiB:.2f} MiB"
    assert device_growth <= 2 * MiB, f"device memory in use grew {device_growth / MiB:.2f} MiB"
    assert mismatches.item() == 0
    for m in MS:
        assert torch.equal(outs[m], first[m]), m


def test_captured_decode_step_replays_identically():
    from mixed_gemm.nn import QuantLinear

    hidden, inter, g = 2048, 5632, 128
    layers = [torch.nn.Linear(hidden, inter, bias=False), torch.nn.Linear(inter, hidden, bias=False)]
    up, down = (QuantLinear.from_linear(lin.half().cuda(), bits=4, group_size=g) for lin in layers)
    codes = [mg.quantize(lin.weight.detach(), bits=4, group_size=g) for lin in layers]
    static_x = torch.empty(1, hidden, device="cuda", dtype=torch.float16)

    def step() -> torch.Tensor:
        return down(torch.nn.functional.silu(up(static_x)), residual=static_x)

    tokens = [torch.randn(1, hidden, device="cuda").half() for _ in range(2)]
    eager = []
    for x in tokens:
        static_x.copy_(x)
        y = step()
        # The float32 reference of the canonical codes, rounding where the step rounds (h, SiLU).
        h = mg.reference.matmul(x, *codes[0], group_size=g, bits=4).half()
        act = torch.nn.functional.silu(h.float()).half()
        assert_elementwise(y, mg.reference.matmul(act, *codes[1], group_size=g, bits=4) + x.float(), inter,
                           chained=2)
        eager.append(y.clone())
    side = torch.cuda.Stream()  # warm-up off the capturing stream, as torch's graph docs do
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    mismatches = torch.zeros((), dtype=torch.int32, device="cuda")
    allocated = torch.cuda.memory_allocated()
    for i in range(REPLAYS):
        static_x.copy_(tokens[i % 2])
        out.fill_(float("nan"))  # a replay that wrote nothing would leave NaN
        graph.replay()
        mismatches.add_((out != eager[i % 2]).any().int())  # counted on the GPU: no host sync per replay
    torch.cuda.synchronize()
    assert mismatches.item() == 0, f"{mismatches.item()} of {REPLAYS} replays differ from the eager step"
    assert torch.equal(out, eager[(REPLAYS - 1) % 2])
    assert torch.cuda.memory_allocated() == allocated
