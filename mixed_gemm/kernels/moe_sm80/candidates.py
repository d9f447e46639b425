"""The moe_sm80 schedules worth timing for one projection: every catalog tile of its stage, plain
and (the 128-row tiles) fused."""
from __future__ import annotations

from typing import List

from ..base import MoeProblem
from .catalog import FUSED_SHAPES, SHAPES
from .config import MoeSm80Config


def candidate_schedules(problem: MoeProblem) -> List[str]:
    return [MoeSm80Config(stage=problem.stage, tile=t, warps=w, stages=s, fused=f).schedule
            for f, shapes in ((False, SHAPES), (True, FUSED_SHAPES)) for t, w, s in shapes]
