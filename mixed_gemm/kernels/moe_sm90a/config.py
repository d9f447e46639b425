"""``MoeSm90aConfig``: the frozen configuration of the grouped wgmma MoE family, its single source
of truth: name, rendered source, build-cache key and schedule derive from it."""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, raise_on

_SCHEDULE = re.compile(r"^(w13|w2)_t(\d+)x(\d+)x(\d+)_s(\d+)$")
STAGES = ("w13", "w2")


@hash_once
@dataclass(frozen=True)
class MoeSm90aConfig:
    """One launch configuration of the grouped Hopper kernel (templates/moe_sm90a/): CUTLASS's
    ptr-array cooperative wgmma mixed-input GEMM, one group per expert, over the rows routed to it.

    Compiled in: ``dtype``, ``bits``, ``tile`` = (TM weight rows, TN routed rows, TK) per CTA (the
    transposed problem, as the dense sm90a family's), ``stages`` (0 = as many as fit). Chosen at
    launch: ``stage``, the projection this config runs (``"w13"``: the gate|up GEMM, then SiLU(gate)
    * up; ``"w2"``: the down GEMM, then the top-k weighted sum), which changes what the launcher does
    around the one kernel, not the kernel. ``zero_mode`` is folded into the additive zero at prepack
    (one binary serves every mode). ``schedule`` (``w13_t128x64x64_s0``) is what a profile stores (as
    ``moe_sm90a:<schedule>``)."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    stage: str = "w13"
    tile: Tuple[int, int, int] = (128, 64, 64)
    stages: int = 0

    family = "moe_sm90a"

    def __post_init__(self) -> None:
        tm, tn, tk = self.tile
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode) + [
            (self.stage in STAGES, f"stage must be one of {STAGES} (gate|up or down)"),
            # Two consumer warpgroups split the tile's weight rows (the cooperative schedule).
            (tm in (128, 256), "tile M (weight rows) must be 128 or 256 (two warpgroups split it)"),
            (16 <= tn <= 256 and tn % 16 == 0, "tile N (routed rows) must be a multiple of 16 in [16, 256]"),
            (tk in (64, 128), "tile K must be 64 or 128 (four k16 blocks per stage at least)"),
            (self.stages == 0 or 2 <= self.stages <= 12, "stages must be 0 (auto) or 2..12"),
        ], f"MoeSm90aConfig {self.tile}")

    @property
    def layout(self) -> str:
        return "sm90a"

    @property
    def threads(self) -> int:
        return 384  # one producer warpgroup + two consumer warpgroups

    @functools.cached_property
    def kernel(self) -> "MoeSm90aConfig":
        """The compiled identity: the zero mode folded, the stage (a launch-time choice) at its default."""
        return dataclasses.replace(self, zero_mode="int", stage="w13")

    @functools.cached_property
    def _tile_schedule(self) -> str:
        tm, tn, tk = self.tile
        return f"t{tm}x{tn}x{tk}_s{self.stages}"

    @functools.cached_property
    def kernel_name(self) -> str:
        return f"mg_moe_sm90a_{self.dtype}_u{self.bits}_{self._tile_schedule}"

    @functools.cached_property
    def schedule(self) -> str:
        return f"{self.stage}_{self._tile_schedule}"

    @functools.cached_property
    def name(self) -> str:
        return f"mg_moe_sm90a_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "MoeSm90aConfig":
        m = _SCHEDULE.match(schedule)
        if m is None:
            raise ValueError(f"schedule: {schedule!r} is not a moe_sm90a schedule <w13|w2>_t<TM>x<TN>x<TK>_s<stages>")
        stage, tm, tn, tk, stages = m.groups()
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, stage=stage, tile=(int(tm), int(tn), int(tk)),
                   stages=int(stages))

    def replace(self, **changes) -> "MoeSm90aConfig":
        return dataclasses.replace(self, **changes)
