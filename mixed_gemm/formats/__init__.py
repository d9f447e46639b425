"""Pure-torch weight formats: checkpoint layouts <-> canonical ``(q, s, z)``, and RTN quantization.

Canonical form: ``q`` uint8 ``(N, K)``, ``s`` ``(N, K // G)`` float, ``z`` like ``s`` (integers) or
``None`` (symmetric).  See :mod:`mixed_gemm.formats.checkpoint` for the exact layouts.
"""
from __future__ import annotations

from ._checks import BITS, FORMATS, check_finite, check_g_idx
from .checkpoint import AWQ_ORDER, check_format_args, pack, resolve_zero_mode, unpack
from .groups import expand_groups, make_g_idx
from .quantize import quantize
from .sparse import sparsify_quantize

__all__ = [
    "resolve_zero_mode",
    "sparsify_quantize",
    "AWQ_ORDER",
    "BITS",
    "check_finite",
    "check_format_args",
    "check_g_idx",
    "FORMATS",
    "expand_groups",
    "make_g_idx",
    "pack",
    "quantize",
    "unpack",
]
