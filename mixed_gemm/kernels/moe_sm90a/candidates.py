"""The moe_sm90a schedules worth timing for one projection: every catalog tile of its stage."""
from __future__ import annotations

from typing import List

from ..base import MoeProblem
from .catalog import TILES
from .config import MoeSm90aConfig


def candidate_schedules(problem: MoeProblem) -> List[str]:
    return [MoeSm90aConfig(stage=problem.stage, tile=t).schedule for t in TILES]
