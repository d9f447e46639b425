"""gemv's one-shot mode (``_os``: each CTA's whole share of the weight copied into shared memory at
its start, units of 16 rows over all of K, no split K) on the GPU: every one-shot catalog kernel
against the float32 reference (element-wise) over weight kinds, group sizes (32 and per channel
included), M from 1 to 8, ragged N and K (K % 16 == 8), with bias and with a residual;
outputs poisoned first (the gemv sweep's check); CUDA-graph capture; a weight whose share does not fit is refused before any
launch."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import gemv
from mixed_gemm.kernels.gemv.catalog import oneshot_shapes
import test_gemv_gpu as gemv_gpu  # (a module: its tests are not collected again here)
from test_gemv_gpu import _weight
from test_sm90a_gpu import TOL, ZERO_KINDS
from weights import rel_err, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GROUPS = (32, 64, 128, -1)


def _params():
    rng = random.Random(15)
    cases = []
    grid = [(shape, dtype, bits) for bits in (4, 8) for shape in oneshot_shapes(bits) for dtype in ("f16", "bf16")]
    for i, (shape, dtype, bits) in enumerate(grid):
        tokens = shape["tokens"]
        for j in range(4):  # kinds, groups, M and shapes rotate; two of the four in the 8B shapes' range
            zero = ZERO_KINDS[(i + j) % len(ZERO_KINDS)]
            group = GROUPS[(i + j) % len(GROUPS)]
            n = [4096, 2 * rng.randrange(8, 1500), 6144, 2 * rng.randrange(8, 300)][j]
            k = 4096 if j in (0, 2) else (group * rng.randrange(1, 24) if group != -1 else 8 * rng.randrange(2, 400))
            m = [1, tokens, rng.randrange(1, tokens + 1), tokens // 2 + 1][j]
            cfg = gemv.GemvConfig(bits=bits, **shape)
            while not cfg.oneshot_fits(n, k, group)[0]:  # (int8 at group 32: 6144 rows' share is past 227 KB)
                n //= 2
            schedule = cfg.schedule
            cases.append(pytest.param(schedule, dtype, bits, zero, group, m, n, k,
                                      id=f"{schedule}-{dtype}-u{bits}-{zero}-g{group}-m{m}n{n}k{k}"))
    return cases


@pytest.mark.parametrize("schedule,dtype,bits,zero,group,m,n,k", _params())
def test_matches_reference(schedule, dtype, bits, zero, group, m, n, k):
    """The gemv sweep's check (poisoned output, bias on odd seeds, the float32 reference)."""
    gemv_gpu.test_sweep(schedule, dtype, bits, zero, group, m, n, k)


@pytest.mark.parametrize("schedule", ["m8_s1_w8x1_u1_os"])
def test_residual_and_graph_capture(schedule):
    """The residual added in fp32 before the one rounding (as gemv's epilogue), and a captured call
    replayed on new x matching the eager one bitwise."""
    n, k = 4096, 4096
    w, q, ref = _weight("f16", 4, "int", 128, n, k, seed_of("os-graph", schedule))
    cfg = gemv.GemvConfig.from_schedule(schedule, zero_mode=w.zero_mode)
    m = cfg.tokens - 3
    x = torch.randn(m, k, device="cuda").half()
    residual = torch.randn(m, n, device="cuda").half()
    out = mg.matmul(x, w, config=cfg, residual=residual)
    want = mg.reference.matmul(x, q, **ref) + residual.float()
    assert rel_err(out, want, k) <= TOL["f16"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mg.matmul(x, w, config=cfg, residual=residual)
    x.copy_(torch.randn(m, k, device="cuda").half())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, mg.matmul(x, w, config=cfg, residual=residual))


def test_refuses_a_share_that_does_not_fit():
    """8192x8192 is 33.5 MB: ~260 KB an SM, past shared memory. can_implement says so; a forced config
    raises ValueError naming w before any launch (the poisoned output stays NaN)."""
    w, _, _ = _weight("f16", 4, "int", 128, 8192, 8192, 5)
    cfg = gemv.GemvConfig.from_schedule("m8_s1_w8x1_u1_os", zero_mode=w.zero_mode)
    x = torch.randn(4, 8192, device="cuda").half()
    out = torch.full((4, 8192), float("nan"), device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="one-shot mode"):
        mg.matmul(x, w, config=cfg, out=out)
    assert torch.isnan(out).all()
