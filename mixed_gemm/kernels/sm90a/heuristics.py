"""The sm90a family's choice when no profile covers a problem, kept as data.

Up to 8 rows the gemv family streams the weight faster (one n8 token tile, no pipeline prologue),
so this family passes. From ``FROM_M`` on it takes every M (the 32-token tile with split-K matched
the sm80 decode tiles at 16 tokens and beat them at 32 on the H100 profile, and the gemv kernels
above 8 tokens): a token tile that M fills, and split-K when the weight tiles alone
leave most SMs idle (a 4096-row weight is 32 tiles of 128 rows for 132 SMs).
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..base import Problem
from .config import Sm90aConfig

FROM_M = 9
# (max M, schedule with TK = 128, schedule with TK = 64 for groups that are not a multiple of 128),
# from the H100 profile (profiles/h100-sm90a-f16.csv.gz, 8 Llama-3 shapes, M 16..8192): thin token
# tiles split over K below 128 rows, square tiles with activation multicast up to 256, wide
# 128x256 tiles with a swizzled order beyond 1024.
ROWS: Tuple[Tuple[int, str, str], ...] = (
    (32, "t128x32x128_coop_c1x1_s0_dp", "t128x64x64_coop_c1x1_s0_dp"),
    (64, "t128x64x128_coop_c1x1_s0_dp", "t128x64x64_coop_c1x1_s0_dp"),
    (128, "t128x128x128_coop_c1x1_s0_dp", "t128x128x64_coop_c1x1_s0_dp"),
    (256, "t128x128x128_coop_c2x1_s0_dp", "t128x128x64_coop_c1x1_s0_dp"),
    (1024, "t128x256x64_coop_c2x1_s0_dp", "t128x256x64_coop_c2x1_s0_dp"),
    (1 << 62, "t128x256x64_coop_c2x1_s0_dp_sw4_rn", "t128x256x64_coop_c2x1_s0_dp_sw4_rn"),
)
SPLIT_BELOW = 0.5       # split K when the tiles cover less than this share of the SMs
MIN_K_TILES = 4         # k-tiles each split keeps at least


def heuristic_config(problem: Problem, sms: int) -> Optional[Sm90aConfig]:
    m, n, k, g = problem.m, problem.n, problem.k, problem.group_size
    if m < FROM_M:
        return None
    if g != k and g % 64:
        return None  # group 32: no tile K divides it (TK >= 64); the sm80 family serves it
    for max_m, wide, narrow in ROWS:
        if m <= max_m:
            break
    schedule = wide if (g == k or g % 128 == 0) else narrow
    if problem.bits != 4:  # clusters are compiled for int4 weights only (catalog.CLUSTER_SHAPES)
        schedule = schedule.replace("_c2x1_", "_c1x1_")
    config = Sm90aConfig.from_schedule(schedule, **problem.kind)
    tm, tn, tk = config.tile
    tiles = -(-n // tm) * -(-m // tn)
    if tiles < SPLIT_BELOW * sms:
        splits = min(sms // tiles, -(-k // tk) // MIN_K_TILES, 16)
        if splits > 1:
            config = config.replace(decomposition="split", splits=splits, swizzle=1, raster="h")
    return config
