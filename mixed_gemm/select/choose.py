"""Pick the configuration of one problem: override, then profile, then heuristics.

Called once per (weight, M bucket); :func:`mixed_gemm.matmul` keeps the answer in the weight, so
the hot path is a dict lookup.
"""
from __future__ import annotations

import os

from ..codegen import KernelConfig
from .heuristics import heuristic_config
from .profiles import device_profile

SCHEDULE_ENV = "MIXED_GEMM_SCHEDULE"


def choose_config(m: int, *, n: int, k: int, bits: int, zero_mode: str, dtype: str, group_size: int,
                  device_index: int) -> KernelConfig:
    """The config for an ``m`` x ``n`` x ``k`` problem on ``device_index``.

    1. ``$MIXED_GEMM_SCHEDULE`` (a schedule, see :attr:`KernelConfig.schedule`) forces one for every
       weight kind (sweeps, debugging; read when a weight first meets an M bucket);
    2. the GPU's profile (:mod:`mixed_gemm.select.profiles`), nearest measured M bucket;
    3. :func:`heuristic_config`.
    """
    kind = dict(dtype=dtype, bits=bits, zero_mode=zero_mode)
    forced = os.environ.get(SCHEDULE_ENV)
    if forced:
        try:
            return KernelConfig.from_schedule(forced, **kind)
        except ValueError as exc:
            raise ValueError(f"{SCHEDULE_ENV}: {exc}") from None
    profile = device_profile(device_index)
    if profile is not None:
        schedule = profile.lookup((dtype, bits, zero_mode, group_size, n, k), m)
        if schedule is not None:
            return KernelConfig.from_schedule(schedule, **kind)
    return heuristic_config(m, n=n, k=k, device_index=device_index, **kind)
