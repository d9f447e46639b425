"""The sm90s family's choice when no profile covers a problem, kept as data.

Off by default: the H100 profile picks sm90s where it measured faster (M = 16-64 on the Llama-3
shapes, docs/notes/serving-mainloop.md); on shapes no profile names, selection keeps the measured
defaults (gemv, the sm80 16-token tiles, sm90a) until a held-out check (bench/heldout_check.py)
shows these rows within reach of the sweep's best. ``MIXED_GEMM_SM90S=1`` lets the heuristic take
9 <= M <= 256 (A/B runs). Profiles that name ``sm90s:`` schedules are used either way.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

from ..base import Problem
from .config import Sm90sConfig

SWITCH_ENV = "MIXED_GEMM_SM90S"
FROM_M, TO_M = 9, 256
# (max M, schedule): the smallest token tile that M fills, the split factor chosen per shape.
ROWS: Tuple[Tuple[int, str], ...] = (
    (16, "t128x16x128_c1x1_o1_s0_auto"),
    (32, "t128x32x128_c1x1_o1_s0_auto"),
    (64, "t128x64x128_c1x1_o1_s0_auto"),
    (128, "t128x128x128_c1x1_o1_s0_auto"),
    (256, "t128x256x128_c1x1_o1_s0_auto"),
)
ROWS_U8 = ((16, "t128x16x128_c1x1_o1_s0_auto"), (64, "t128x64x128_c1x1_o1_s0_auto"),
           (256, "t128x256x64_c1x1_o1_s0_auto"))


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "") not in ("", "0")


def heuristic_config(problem: Problem, sms: int) -> Optional[Sm90sConfig]:
    if not enabled() or not FROM_M <= problem.m <= TO_M:
        return None
    rows = ROWS if problem.bits == 4 else ROWS_U8
    for max_m, schedule in rows:
        if problem.m <= max_m:
            return Sm90sConfig.from_schedule(schedule, **problem.kind)
    return None
