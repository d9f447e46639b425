"""Versions of what kernels depend on (for `mixed-gemm info` and profile headers)."""
from __future__ import annotations

from .compile.errors import BuildError


def torch_version() -> str:
    import torch

    return torch.__version__


def torch_cuda() -> str:
    import torch

    return torch.version.cuda or "none (CPU build)"


def driver() -> str:
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
    except Exception:  # noqa: BLE001 - no libcuda.so raises from the import or the call
        return "no driver found"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"no driver found ({err.name})"
    return f"{version // 1000}.{version % 1000 // 10}"


def nvcc() -> str:
    from .compile.nvcc import find_nvcc, nvcc_version

    try:
        path = find_nvcc()
    except BuildError:
        return "not found (set CUDA_HOME or put nvcc on PATH)"
    return f"{nvcc_version()} ({path})"


def cutlass() -> str:
    from .compile.nvcc import cutlass_include_dir, cutlass_version

    return f"{cutlass_version()} ({cutlass_include_dir()})"
