"""Compiling generated CUDA C++ to fatbins with nvcc, and caching them on disk.

``build_fatbin(name, source, arch_flags=...)`` is the entry point; ``build_many`` runs several at
once. Nothing here knows about kernel families: they hand in source text, arch flags and the
template folders their source includes.
"""
from __future__ import annotations

from . import background, packages
from .cache import BuildSpec, build_fatbin, build_many, build_spec, build_specs, cache_key, load_bytes, lookup, toolchain
from .errors import BuildError
from .policy import JIT_ENV, JitDisabledError, blocking, jit_mode
from .fatbin import FATBIN_MAGIC, fatbin_targets
from .nvcc import (
    compile_cubin,
    compile_fatbin,
    compile_flags,
    cutlass_include_dir,
    cutlass_version,
    find_nvcc,
    key_flags,
    nvcc_version,
    ptxas_usage,
)

__all__ = [
    "FATBIN_MAGIC",
    "JIT_ENV",
    "BuildError",
    "BuildSpec",
    "JitDisabledError",
    "background",
    "blocking",
    "build_spec",
    "build_specs",
    "jit_mode",
    "lookup",
    "packages",
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
    "key_flags",
    "load_bytes",
    "nvcc_version",
    "ptxas_usage",
    "toolchain",
]
