"""Fixtures for the formats tests: per-test seeded generators and random canonical / packed data."""
from __future__ import annotations

import zlib

import pytest
import torch

CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
)


@pytest.fixture(params=["cpu", CUDA])
def device(request) -> str:
    """Parametrizes a test over CPU and (when available) CUDA."""
    return request.param


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the test id: fresh values per test, reproducible across runs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def random_canonical(gen, n, k, *, bits=4, group_size=128, symmetric=False, dtype=torch.float16,
                     device="cpu"):
    """Random ``(q, s, z)``; ``q`` always contains 0 and ``2**bits - 1`` (sign bit of packed words)."""
    g = k if group_size == -1 else group_size
    top = 1 << bits
    q = torch.randint(0, top, (n, k), generator=gen, dtype=torch.int64)
    q[0, 0], q[-1, -1] = 0, top - 1
    s = (torch.rand(n, k // g, generator=gen) * 0.1 + 1e-3).to(dtype)
    z = None
    if not symmetric:
        z = torch.randint(0, top, (n, k // g), generator=gen, dtype=torch.int64)
        z[0, 0], z[-1, -1] = 0, top - 1
        z = z.to(dtype).to(device)
    return q.to(torch.uint8).to(device), s.to(device), z


def random_words(gen, *shape, device="cpu"):
    """Random int32 words over the full range (sign bit included)."""
    w = torch.randint(-(2**31), 2**31, shape, generator=gen, dtype=torch.int64)
    w.view(-1)[0] = -1  # all fields at their maximum
    return w.to(torch.int32).to(device)


@pytest.fixture
def canonical(gen):
    """Factory: ``canonical(n, k, bits=..., group_size=..., symmetric=..., dtype=..., device=...)``."""
    return lambda n, k, **kw: random_canonical(gen, n, k, **kw)


@pytest.fixture
def words(gen):
    """Factory: ``words(*shape, device=...)`` -> random int32 tensor."""
    return lambda *shape, **kw: random_words(gen, *shape, **kw)
