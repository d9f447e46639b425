"""The gemv family's choice when no profile covers a problem, kept as data.

It serves M up to ``MAX_M`` tokens (the n8 tiles of mma.sync: 8, 16 or 32 rows of x). The grid
must cover every SM several times over for the weight to stream at full bandwidth: K is split
across CTAs until the row tiles times the splits reach ``CTAS_PER_SM`` per SM, keeping at least
``MIN_STEPS`` warp steps per split.
"""
from __future__ import annotations

from typing import Optional

from ..base import Problem
from .config import MAX_SPLITS, GemvConfig

MAX_M = 32
# Above this M, a weight that also holds the sm80 copy runs the sm80 decode tiles, measured faster
# there on the H100 (the gemv kernel's activation loads touch one 128-byte line per token row).
SM80_FROM_M = 8
CTAS_PER_SM = 4
MIN_STEPS = 1
# (max M, schedule) for int4; int8 halves the unroll (catalog.shapes_for).
ROWS = ((8, "m8_s2_w4x2_u8"), (16, "m16_s2_w4x2_u8"), (32, "m32_s1_w4x2_u4"))


def splits_for(config: GemvConfig, n: int, k: int, sms: int) -> int:
    row_tiles = config.launch_geometry(n, k)[0]
    steps = config.steps(k)
    want = -(-CTAS_PER_SM * sms // row_tiles)
    return max(1, min(want, steps // MIN_STEPS, MAX_SPLITS))


# The lowbit layout (1-3 bits; its catalog.LOWBIT_SHAPES): up to 8 tokens. From 9 the sm80 family's
# `_lowbit` tiles take it: on the H100 they beat every gemv kernel at M 16 and 32 (11-48%), and this
# table's m16/m32 rows were 2.2x off the best there (docs/notes/selection.md).
LOWBIT_ROWS = ((8, "m8_s2_w4x2_u16"),)
LOWBIT_MAX_M = LOWBIT_ROWS[-1][0]
# 1:2-sparse 7 bits (mma.sp's fragments, which the sm80 tiles cannot read): gemv up to 32 tokens.
SPARSE_ROWS = ((8, "m8_s2_w4x2_u16"), (16, "m16_s4_w2x2_u8_xs"), (32, "m32_s4_w2x2_u4_xs"))


def heuristic_config(problem: Problem, sms: int) -> Optional[GemvConfig]:
    layouts = problem.layout.split("+")
    if problem.m > MAX_M:
        return None
    if layouts == ["lowbit"] and problem.bits == 7:
        rows = SPARSE_ROWS
    elif layouts == ["lowbit"]:
        if problem.m > LOWBIT_MAX_M:
            return None  # the sm80 family's _lowbit tiles
        rows = LOWBIT_ROWS
    elif "sm90a" not in layouts or (problem.m > SM80_FROM_M and "sm80" in layouts):
        return None  # the sm80-layout kernels are chosen by profiles only, until measured
    else:
        rows = ROWS
    schedule = next(s for max_m, s in rows if problem.m <= max_m)
    config = GemvConfig.from_schedule(schedule, **problem.kind)
    if problem.bits == 8:
        config = config.replace(unroll=max(1, config.unroll // 2))
    return config.replace(splits=splits_for(config, problem.n, problem.k, sms))
