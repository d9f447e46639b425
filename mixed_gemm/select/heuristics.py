"""Heuristic kernel choice, kept as data.

Small M is memory-bound: stream B once with as many bytes in flight as possible, so thin tiles
with K split over warps, and split-K across blocks until the grid covers the GPU
``SPLIT_K_TARGET_WAVES`` times. The split-K mode is "fused" (the last slice of a tile sums the
others): on the H100 parallel split-K beat no split by 15-50% on every decode shape with
N <= 10240 (bench/NOTES.md, v2), and the fused variant drops its second launch. Serial split-K lost
to its slice-by-slice epilogue beyond 2 slices. Mid M is math-bound on mma.sync: square tiles
amortize the dequantization over 64 rows per warp. Large M: dequantize the weight once (at ~96% of
copy bandwidth) and let cuBLAS's Hopper kernels do the math.
"""
from __future__ import annotations

import functools
from typing import Tuple

from ..codegen import KernelConfig

# (max M, schedule); the last row covers every larger M. Schedules name catalog kernels
# (tests/select/test_heuristics.py checks) or "dequant_mm".
HEURISTICS: Tuple[Tuple[int, str], ...] = (
    (16, "t16x64x128_w1x1x4_s4"),
    (64, "t64x128x64_w2x2x1_s4"),
    (512, "t128x128x64_w2x2x1_s4"),
    (1 << 62, "dequant_mm"),
)
SPLIT_K_MODE = "fused"
SPLIT_K_BELOW_WAVES = 2       # split only grids smaller than this many blocks per SM
SPLIT_K_TARGET_WAVES = 4      # blocks per SM to aim for when splitting K
SPLIT_K_MIN_TILES = 4         # k-tiles each slice keeps at least
SPLIT_K_MAX = 4               # the largest factor measured to help (8 not yet profiled)
DEFAULT_SMS = 132             # H100 SXM, when no GPU is visible (tests)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(device_index).multi_processor_count
    except Exception:  # noqa: BLE001 - a CPU-only torch: fall back to the default
        pass
    return DEFAULT_SMS


def m_bucket(m: int) -> int:
    """The power of two at or above ``m``: the key selection tables use for M."""
    return 1 << max(0, (m - 1).bit_length())


def split_k_for(blocks: int, k_tiles: int, sms: int) -> int:
    """Slices that bring ``blocks`` up to the target waves, keeping SPLIT_K_MIN_TILES k-tiles each."""
    if blocks >= SPLIT_K_BELOW_WAVES * sms:
        return 1
    want = -(-SPLIT_K_TARGET_WAVES * sms // max(blocks, 1))
    return max(1, min(want, k_tiles // SPLIT_K_MIN_TILES, SPLIT_K_MAX))


def heuristic_config(m: int, *, n: int, k: int, bits: int, zero_mode: str, dtype: str = "f16",
                     device_index: int = 0) -> KernelConfig:
    for max_m, schedule in HEURISTICS:
        if m <= max_m:
            break
    config = KernelConfig.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=zero_mode)
    if config.method != "mixed":
        return config
    bm, bn, bk = config.tile
    blocks = -(-m // bm) * -(-n // bn)
    splits = split_k_for(blocks, -(-k // bk), sm_count(device_index))
    if splits > 1:
        config = config.replace(split_k_mode=SPLIT_K_MODE, split_k=splits)
    return config
