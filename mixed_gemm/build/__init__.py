"""Compiling generated CUDA C++ to fatbins with nvcc, and caching them on disk.

``build_fatbin(name, source)`` is the entry point; ``build_many`` runs several at once.
"""
from __future__ import annotations

from .cache import build_fatbin, build_many, cache_key, load_bytes
from .errors import BuildError
from .fatbin import FATBIN_MAGIC, fatbin_targets
from .nvcc import (
    ARCH_FLAGS,
    compile_cubin,
    compile_fatbin,
    compile_flags,
    cutlass_include_dir,
    cutlass_version,
    find_nvcc,
    nvcc_version,
)

__all__ = [
    "ARCH_FLAGS",
    "FATBIN_MAGIC",
    "BuildError",
    "build_fatbin",
    "build_many",
    "cache_key",
    "compile_cubin",
    "compile_fatbin",
    "compile_flags",
    "cutlass_include_dir",
    "cutlass_version",
    "fatbin_targets",
    "find_nvcc",
    "load_bytes",
    "nvcc_version",
]
