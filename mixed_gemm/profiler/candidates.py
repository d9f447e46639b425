"""The schedules ``mixed-gemm profile`` times for one problem: every family that runs on the GPU
offers its own (:meth:`Family.candidates`), qualified as ``family:schedule``."""
from __future__ import annotations

from typing import List, Optional

from ..kernels import FAMILIES, Problem, split_schedule


def candidate_schedules(problem: Problem, sms: int, device_index: Optional[int] = None,
                        only: Optional[List[str]] = None, families: Optional[List[str]] = None) -> List[str]:
    """``family:schedule`` strings worth timing for ``problem``. ``only`` replaces the list (bare
    schedules read as sm80's); ``families`` keeps only those families' candidates; ``device_index``
    drops families that do not run there; tile families whose layout the weight lacks offer nothing."""
    if only:
        return [f"{fam.name}:{sched}" for fam, sched in map(split_schedule, only)]
    out: List[str] = []
    for fam in FAMILIES:
        if families and fam.name not in families:
            continue
        if device_index is not None and not fam.supports(device_index)[0]:
            continue
        if not fam.reads_weight(problem)[0]:
            continue
        out += [f"{fam.name}:{s}" for s in fam.candidates(problem, sms)]
    return out
