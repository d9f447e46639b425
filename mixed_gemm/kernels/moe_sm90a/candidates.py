"""The moe_sm90a schedules worth timing for one projection: every ``TILES`` tile of its stage; from
``MANY_TOKENS`` tokens on, also the many-token kernels (clusters of two, the 256-weight-row tile)
and every kernel again with the routed-row tiles first in the scheduler's walk (raster ``n``)."""
from __future__ import annotations

from typing import List

from ..base import MoeProblem
from .catalog import TILES, kernels_for
from .config import RASTERS, MoeSm90aConfig

MANY_TOKENS = 1024


def candidate_schedules(problem: MoeProblem) -> List[str]:
    if problem.tokens < MANY_TOKENS:
        return [MoeSm90aConfig(stage=problem.stage, tile=t).schedule for t in TILES]
    return [MoeSm90aConfig(stage=problem.stage, tile=t, cluster=c, raster=r).schedule
            for r in RASTERS for t, c in kernels_for(problem.bits)]
