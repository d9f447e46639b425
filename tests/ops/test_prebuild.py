"""``mg.prebuild``: bad arguments raise before anything is built (CPU); on the GPU it builds what
selection picks (and, for a group, the fused all-reduce kernels), after which those calls run with
the JIT off and compute the reference."""
import pytest
import torch

import mixed_gemm as mg
from weights import random_weight, rel_err, seed_of


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(ms=[]), ValueError, "ms: expected row counts"),
    (dict(ms=[0]), ValueError, "ms: expected row counts"),
    (dict(ms=[True]), ValueError, "ms: expected row counts"),
    (dict(ms=[1], world=1), ValueError, "world: expected a group size >= 2"),
    (dict(ms=[1], row_parallel=[object()]), ValueError, "row_parallel: the fused all-reduce kernels need world"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        mg.prebuild([], **kwargs)


def test_weights_must_be_packed_weights():
    with pytest.raises(TypeError, match="weights: expected PackedWeights, got Tensor"):
        mg.prebuild([torch.zeros(2, 2)], [1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prebuilt_kernels_run_with_the_jit_off(tmp_cache, monkeypatch):
    from mixed_gemm.select.selection import clear_selection

    n, k, g = 1536, 1024, 128
    (q, s, z), packed = random_weight(n, k, fmt="awq", bits=4, symmetric=False, group_size=g, device="cuda",
                                      seed=seed_of("prebuild"))
    w = mg.prepack(*packed, format="awq", bits=4, group_size=g)
    ms = (1, 8)  # gemv rows: seconds of nvcc in the empty cache (a tile's library takes a minute)
    assert mg.prebuild([w], ms, world=2, row_parallel=[w]) >= len(ms)
    monkeypatch.setenv("MIXED_GEMM_JIT", "off")  # from here a kernel not in the cache raises
    clear_selection()
    for m in ms:
        x = torch.randn(m, k, device="cuda").half()
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        mg.matmul(x, w, out=out)
        assert rel_err(out, mg.reference.matmul(x, q, s, z, group_size=g, bits=4), k) <= 2e-3
