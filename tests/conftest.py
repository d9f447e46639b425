"""Shared fixtures: an isolated kernel cache, and skipping of ``@pytest.mark.gpu`` tests on CPU."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/tolerance.py
# Tests check and time the kernel selection picks, not the stand-in an asynchronous cold call runs
# while that kernel compiles (tests of the asynchronous path set the mode themselves).
os.environ.setdefault("MIXED_GEMM_JIT", "block")

GPUS_ENV = "MIXED_GEMM_TEST_GPUS"


def _spread_workers_over_gpus():
    """``$MIXED_GEMM_TEST_GPUS=n`` under pytest-xdist: worker ``gwK`` sees only GPU ``K mod n``, so
    one call of a machine with n GPUs runs n times the workers a single GPU holds. Set here, at
    import, before anything initializes CUDA (which reads ``CUDA_VISIBLE_DEVICES`` once); tests that
    need several GPUs then skip and run in a call of their own, without the setting."""
    raw, worker = os.environ.get(GPUS_ENV), os.environ.get("PYTEST_XDIST_WORKER", "")
    if not raw or not worker.startswith("gw"):
        return
    try:
        count = int(raw)
        if count < 1:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"{GPUS_ENV}={raw!r}: expected a whole number of GPUs >= 1") from None
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % count)


_spread_workers_over_gpus()


def _skip_nvcc_tests_without_nvcc(items):
    nvcc_items = [item for item in items if item.get_closest_marker("nvcc") is not None]
    if not nvcc_items:
        return
    from mixed_gemm.compile import BuildError, find_nvcc

    try:
        find_nvcc()
    except BuildError:
        skip = pytest.mark.skip(reason="nvcc not found (CUDA_HOME, CUDA_PATH or PATH)")
        for item in nvcc_items:
            item.add_marker(skip)


SHARD_ENV = "MIXED_GEMM_TEST_SHARD"


def _keep_shard(config, items):
    """``$MIXED_GEMM_TEST_SHARD=i/n`` keeps the i-th of n disjoint parts of the collected tests (by a
    hash of each node id, so a part is the same on every machine): a suite longer than one GPU
    call runs as n calls whose parts add up to the whole."""
    raw = os.environ.get(SHARD_ENV)
    if not raw:
        return
    import zlib

    try:
        index, count = (int(v) for v in raw.split("/"))
        if not 1 <= index <= count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"{SHARD_ENV}={raw!r}: expected i/n with 1 <= i <= n") from None
    keep, drop = [], []
    for item in items:
        (keep if zlib.crc32(item.nodeid.encode()) % count == index - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    _keep_shard(config, items)
    _skip_nvcc_tests_without_nvcc(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # don't pay for importing torch when nothing asks for a GPU
    try:
        import torch

        available = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken torch/CUDA install means "no GPU" here
        available = False
    if available:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    """Point the kernel cache (MIXED_GEMM_CACHE_DIR) at an empty per-test directory."""
    cache = tmp_path / "kernel-cache"
    monkeypatch.setenv("MIXED_GEMM_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(autouse=True)
def _fixed_seed(request):
    """Every test starts torch's generators (CPU and every GPU) from a seed fixed by its name, so a
    failure reproduces: crc32 of the node id, not ``hash()`` (salted per process)."""
    import zlib

    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
