"""The moe_sm80 schedules worth timing for one projection: every catalog tile of its stage."""
from __future__ import annotations

from typing import List

from ..base import MoeProblem
from .catalog import SHAPES
from .config import MoeSm80Config


def candidate_schedules(problem: MoeProblem) -> List[str]:
    return [MoeSm80Config(stage=problem.stage, tile=t, warps=w, stages=s).schedule for t, w, s in SHAPES]
