"""mg.matmul on the GPU against the float32 reference: fresh random data, poisoned outputs."""
import pytest
import torch

import mixed_gemm as mg
from weights import SCHEMES, random_weight, rel_err, seed_of

pytestmark = pytest.mark.gpu

MS = (1, 3, 16, 33, 128, 1000)
SHAPES = ((256, 256), (4096, 4096), (11008, 4096), (4096, 11008))
GROUPS = (128, -1)
TOL = 2e-3


_seed = seed_of


@pytest.fixture(scope="module")
def weights():
    """One packed weight per (shape, group, scheme), shared by the M sweep (x is fresh per test)."""
    cache = {}

    def get(n, k, group_size, scheme):
        key = (n, k, group_size, scheme)
        if key not in cache:
            _, fmt, bits, sym = next(s for s in SCHEMES if s[0] == scheme)
            canon, packed = random_weight(n, k, fmt=fmt, bits=bits, symmetric=sym, group_size=group_size,
                                          device="cuda", seed=_seed(*key))
            w = mg.prepack(*packed, format=fmt, bits=bits, group_size=group_size)
            cache.clear()  # keep GPU memory bounded: tests are ordered so M varies fastest
            cache[key] = (canon, packed, w, fmt, bits, group_size)
        return cache[key]

    return get


@pytest.mark.parametrize("scheme", [s[0] for s in SCHEMES])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", MS)
def test_matmul_matches_reference(weights, m, n, k, group_size, scheme):
    (q, s, z), _, w, _, bits, _ = weights(n, k, group_size, scheme)
    x = torch.randn(m, k, device="cuda").half()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    y = mg.matmul(x, w, out=out)
    assert y is out
    ref = mg.reference.matmul(x, q, s, z, group_size=group_size, bits=bits)
    torch.cuda.synchronize()
    assert rel_err(y, ref, k) <= TOL


@pytest.mark.parametrize("scheme", [s[0] for s in SCHEMES])
def test_convenience_form_and_bias_and_batch_dims(scheme):
    _, fmt, bits, sym = next(s for s in SCHEMES if s[0] == scheme)
    n, k, g = 384, 512, 128
    (q, s, z), (qw, sc, zs) = random_weight(n, k, fmt=fmt, bits=bits, symmetric=sym, group_size=g,
                                           device="cuda", seed=_seed(scheme, "conv"))
    x = torch.randn(2, 5, k, device="cuda").half()
    bias = torch.randn(n, device="cuda").half()
    # Poison the allocator's free blocks so a missed element would read NaN, not a stale result.
    torch.full((4 << 20,), float("nan"), device="cuda", dtype=torch.float16)
    y = mg.matmul(x, qw, sc, zs, format=fmt, bits=bits, group_size=g, bias=bias)
    assert y.shape == (2, 5, n) and y.dtype == torch.float16
    ref = mg.reference.matmul(x, q, s, z, group_size=g, bits=bits, bias=bias)
    assert rel_err(y, ref, k) <= TOL
    w = mg.prepack(qw, sc, zs, format=fmt, bits=bits, group_size=g)
    assert torch.equal(mg.matmul(x, w, bias=bias), y)  # both forms, same kernel, same bits


def test_m_zero_returns_empty():
    (_, _, _), packed = random_weight(128, 256, fmt="awq", bits=4, symmetric=False, group_size=128,
                                      device="cuda", seed=1)
    w = mg.prepack(*packed, format="awq", bits=4, group_size=128)
    assert mg.matmul(torch.empty(0, 256, device="cuda").half(), w).shape == (0, 128)


def test_cuda_graph_capture_and_replay():
    n, k, g = 1024, 2048, 128
    (q, s, z), packed = random_weight(n, k, fmt="awq", bits=4, symmetric=False, group_size=g,
                                      device="cuda", seed=_seed("graph"))
    w = mg.prepack(*packed, format="awq", bits=4, group_size=g)
    x = torch.randn(16, k, device="cuda").half()
    out = torch.empty(16, n, device="cuda", dtype=torch.float16)
    mg.matmul(x, w, out=out)  # load the module outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_alloc = mg.matmul(x, w)  # allocation from the graph's pool
        mg.matmul(x, w, out=out)
    for _ in range(2):
        x.copy_(torch.randn(16, k, device="cuda").half())
        out.fill_(float("nan"))
        y_alloc.fill_(float("nan"))
        graph.replay()
        ref = mg.reference.matmul(x, q, s, z, group_size=g, bits=4)
        torch.cuda.synchronize()
        assert rel_err(out, ref, k) <= TOL
        assert torch.equal(out, y_alloc)


def test_two_streams_in_flight():
    n, k, g = 2048, 4096, 128
    (q1, s1, z1), p1 = random_weight(n, k, fmt="awq", bits=4, symmetric=False, group_size=g, device="cuda", seed=11)
    (q2, s2, z2), p2 = random_weight(n, k, fmt="gptq_v2", bits=8, symmetric=False, group_size=g, device="cuda",
                                     seed=12)
    w1 = mg.prepack(*p1, format="awq", bits=4, group_size=g)
    w2 = mg.prepack(*p2, format="gptq_v2", bits=8, group_size=g)
    x1 = torch.randn(64, k, device="cuda").half()
    x2 = torch.randn(7, k, device="cuda").half()
    torch.cuda.synchronize()
    st1, st2 = torch.cuda.Stream(), torch.cuda.Stream()
    ys = []
    for _ in range(3):
        with torch.cuda.stream(st1):
            y1 = mg.matmul(x1, w1)
        with torch.cuda.stream(st2):
            y2 = mg.matmul(x2, w2)
        ys.append((y1, y2))
    torch.cuda.synchronize()
    r1 = mg.reference.matmul(x1, q1, s1, z1, group_size=g, bits=4)
    r2 = mg.reference.matmul(x2, q2, s2, z2, group_size=g, bits=8)
    for y1, y2 in ys:
        assert rel_err(y1, r1, k) <= TOL and rel_err(y2, r2, k) <= TOL


def test_errors_raise_before_launch_and_context_survives():
    n, k, g = 256, 512, 128
    (q, s, z), packed = random_weight(n, k, fmt="awq", bits=4, symmetric=False, group_size=g, device="cuda",
                                      seed=5)
    w = mg.prepack(*packed, format="awq", bits=4, group_size=g, layout="sm80")  # the sm80 config below reads it
    x = torch.randn(8, k, device="cuda").half()
    cases = [
        (ValueError, "x: must be on the weight's device", lambda: mg.matmul(x.cpu(), w)),
        (TypeError, "x: expected dtype torch.float16", lambda: mg.matmul(x.float(), w)),
        (ValueError, "x: must be contiguous", lambda: mg.matmul(torch.randn(k, 8, device="cuda").half().t(), w)),
        (ValueError, "x: last dimension", lambda: mg.matmul(x[:, :256].contiguous(), w)),
        (ValueError, "x: data pointer must be 16-byte aligned",
         lambda: mg.matmul(torch.randn(8 * k + 1, device="cuda").half()[1:].view(8, k), w)),
        (ValueError, "bias:", lambda: mg.matmul(x, w, bias=torch.randn(n + 1, device="cuda").half())),
        (ValueError, "out:", lambda: mg.matmul(x, w, out=torch.empty(8, n + 2, device="cuda").half())),
        (TypeError, "x: expected a torch.Tensor", lambda: mg.matmul(x.tolist(), w)),
        (ValueError, "config: .* cannot run this problem: .*8-bit", lambda: mg.matmul(x, w, config=mg.KernelConfig(bits=8))),
        (TypeError, "config: expected a kernel family's config", lambda: mg.matmul(x, w, config="t16x64x128")),
        (ValueError, "scales: required", lambda: mg.matmul(x, packed[0])),
    ]
    for exc, msg, call in cases:
        with pytest.raises(exc, match=msg):
            call()
    y = mg.matmul(x, w)
    torch.cuda.synchronize()
    assert rel_err(y, mg.reference.matmul(x, q, s, z, group_size=g, bits=4), k) <= TOL
