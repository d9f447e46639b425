"""The sm80 family's ``_sm90a`` schedules on the GPU: the multistage mma.sync tiles reading the
Hopper one copy (batches of 9-32 tokens on one copy). Every catalog kernel against the float32
reference, element-wise, over zero kinds, groups 32/64/128/per-channel, the split-K modes and
swizzles, ragged shapes and bias; determinism and graph capture of fused split-K; a profile entry
measured on the sm80 layout serving an sm90a weight."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import sm80
from mixed_gemm.kernels.sm80.config import Sm80Config
from test_gemv_gpu import _weight
from test_sm90a_gpu import DTYPES, TOL, ZERO_KINDS
from weights import deterministic_and_replayable, rel_err, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GROUPS = (32, 64, 128, -1)
LAUNCH = (("none", 1, 1), ("fused", 3, 1), ("parallel", 2, 2), ("serial", 3, 1), ("fused", 8, 4), ("none", 1, 2))


def _params():
    rng = random.Random(2390)
    cases = []
    kernels = [c for c in sm80.FAMILY.catalog() if c.layout == "sm90a"]
    assert kernels, "the catalog compiles the decode tiles for the sm90a layout"
    for i, c in enumerate(kernels):
        for j in range(2):  # two cases per kernel: zero kinds, groups, launches and shapes rotate
            zero = ZERO_KINDS[(i + j) % len(ZERO_KINDS)]
            group = GROUPS[(i + 3 * j) % len(GROUPS)]
            n = 2 * rng.randrange(8, 900)  # ragged against the 16-row atoms and the 64/128-column tiles
            k = group * rng.randrange(1, 20) if group != -1 else 8 * rng.randrange(2, 500)  # K % 16 may be 8
            m = [1, 9, 16, 32, rng.randrange(2, 40)][(2 * i + j) % 5]
            mode, split, swizzle = LAUNCH[(i + j) % len(LAUNCH)]
            sched = c.replace(split_k_mode=mode, split_k=split, swizzle=swizzle).schedule
            cases.append(pytest.param(sched, c.dtype, c.bits, zero, group, m, n, k,
                                      id=f"{sched}-{c.dtype}-u{c.bits}-{zero}-g{group}-m{m}n{n}k{k}"))
    return cases


@pytest.mark.parametrize("schedule,dtype,bits,zero,group,m,n,k", _params())
def test_sweep(schedule, dtype, bits, zero, group, m, n, k):
    seed = seed_of("sm80-on-sm90a", schedule, dtype, bits, zero, group, m, n, k)
    w, q, ref = _weight(dtype, bits, zero, group, n, k, seed)
    tdtype = DTYPES[dtype]
    bias = torch.randn(n, device="cuda").to(tdtype) if seed % 2 else None
    cfg = Sm80Config.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=w.zero_mode)
    assert cfg.layout == "sm90a" and w.layout == "sm90a"
    x = torch.randn(m, k, device="cuda").to(tdtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    mg.matmul(x, w, bias=bias, config=cfg, out=out)
    assert rel_err(out, mg.reference.matmul(x, q, bias=bias, **ref), k) <= TOL[dtype]


@pytest.mark.parametrize("mode", ["fused", "parallel", "serial"])
def test_split_k_deterministic_and_graph_capturable(mode):
    w, q, ref = _weight("f16", 4, "int", 128, 4096, 4096, seed_of("sm80-90a-det", mode))
    cfg = Sm80Config.from_schedule(f"t16x64x128_w1x1x4_s4_sm90a_k{mode}4", zero_mode="int")
    x = torch.randn(16, 4096, device="cuda").half()
    first = deterministic_and_replayable(x, w, cfg)
    assert rel_err(first, mg.reference.matmul(x, q, **ref), 4096) <= 2e-3
