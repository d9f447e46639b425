"""Heuristic choice across families: each family, in the registry's priority order, offers its
config for the problem (its own rules, kept as data in its sub-package) or passes; the first one it
can implement wins. Also the M bucketing every selection table uses."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..kernels import FAMILIES, Family, Problem
from ..kernels.base import sm_count


def m_bucket(m: int) -> int:
    """The power of two at or above ``m``: the key selection tables use for M."""
    return 1 << max(0, (m - 1).bit_length())


def heuristic_choice(problem: Problem, device_index: int, check_device: bool = True, *,
                     capability: Optional[Tuple[int, int]] = None,
                     sms: Optional[int] = None) -> Tuple[Optional[Tuple[Family, object]], List[str]]:
    """``((family, config), [])`` of the first family whose heuristic takes ``problem`` and can
    implement it, else ``(None, reasons)`` with one reason per family. ``check_device=False``
    skips ``supports`` (what would run on a GPU like this one; for tests and docs);
    ``capability``/``sms`` ask for a GPU of that kind instead of device ``device_index`` (what a
    kernel package for an arch must hold)."""
    reasons = []
    sms = sm_count(device_index) if sms is None else sms
    for fam in FAMILIES:
        if check_device:
            ok, why = fam.supports(device_index) if capability is None else fam.runs_on(capability)
            if not ok:
                reasons.append(f"{fam.name}: {why}")
                continue
        ok, why = fam.reads_weight(problem)
        if not ok:  # before its heuristic: a tile family's configs exist only for its layout's widths
            reasons.append(f"{fam.name}: {why}")
            continue
        config = fam.heuristic(problem, sms)
        if config is None:
            reasons.append(f"{fam.name}: its heuristic leaves M={problem.m} to other families")
            continue
        ok, why = fam.can_implement(config, problem)
        if ok:
            return (fam, config), []
        reasons.append(f"{fam.name}: {why}")
    return None, reasons
