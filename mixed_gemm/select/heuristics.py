"""Heuristic kernel choice, kept as data: the largest M each tile shape is meant for.

Small M is memory-bound (stream B once, keep many bytes in flight: thin tiles, K split over
warps); large M is math-bound (square 128x128 tiles amortize the dequantization over 64 rows
per warp).
"""
from __future__ import annotations

from typing import Tuple

from ..codegen import KernelConfig

# (max M, tile (BM, BN, BK), warps (M, N, K), stages); the last row covers every larger M.
HEURISTICS: Tuple[Tuple[int, Tuple[int, int, int], Tuple[int, int, int], int], ...] = (
    (16, (16, 64, 128), (1, 1, 4), 4),
    (64, (64, 128, 64), (2, 2, 1), 4),
    (1 << 62, (128, 128, 64), (2, 2, 1), 4),
)


def m_bucket(m: int) -> int:
    """The power of two at or above ``m``: the key selection tables use for M."""
    return 1 << max(0, (m - 1).bit_length())


def heuristic_config(m: int, *, bits: int, zero_mode: str, dtype: str = "f16") -> KernelConfig:
    for max_m, tile, warps, stages in HEURISTICS:
        if m <= max_m:
            return KernelConfig(dtype=dtype, bits=bits, zero_mode=zero_mode, tile=tile, warps=warps, stages=stages)
    raise AssertionError("HEURISTICS must end with an unbounded row")  # pragma: no cover
