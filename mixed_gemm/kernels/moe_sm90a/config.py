"""``MoeSm90aConfig``: the frozen configuration of the grouped wgmma MoE family, its single source
of truth: name, rendered source, build-cache key and schedule derive from it."""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, one_spelling, raise_on, schedule_fields

_SCHEDULE = re.compile(r"^(w13|w2)_t(\d+)x(\d+)x(\d+)_s(\d+)(?:_c(\d+))?(?:_r([mn]))?$")
STAGES = ("w13", "w2")
CLUSTERS = (1, 2)
RASTERS = ("m", "n")


@hash_once
@dataclass(frozen=True)
class MoeSm90aConfig:
    """One launch configuration of the grouped Hopper kernel (templates/moe_sm90a/): CUTLASS's
    ptr-array cooperative wgmma mixed-input GEMM, one group per expert, over the rows routed to it.

    Compiled in: ``dtype``, ``bits``, ``tile`` = (TM weight rows, TN routed rows, TK) per CTA (the
    transposed problem, as the dense sm90a family's), ``stages`` (0 = as many as fit), ``cluster``
    (CTAs per cluster along the weight rows: 2 pairs CTAs on adjacent weight tiles of one expert,
    which then read the routed rows' tile from L2 once, TMA-multicast to both). Chosen at launch:
    ``stage``, the projection this config runs (``"w13"``: the gate|up GEMM, then SiLU(gate) * up;
    ``"w2"``: the down GEMM, then the top-k weighted sum), which changes what the launcher does around
    the one kernel, not the kernel; ``raster``, the order of an expert's tiles in the persistent group
    scheduler's walk (``"m"``: weight tiles fastest, CUTLASS's default; ``"n"``: routed-row tiles
    fastest). ``zero_mode`` is folded into the additive zero at prepack (one binary serves every
    mode). ``schedule`` (``w13_t128x64x64_s0``, ``w2_t128x128x64_s0_c2_rn``: the suffixes only where
    they are not 1 / ``m``) is what a profile stores (as ``moe_sm90a:<schedule>``)."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    stage: str = "w13"
    tile: Tuple[int, int, int] = (128, 64, 64)
    stages: int = 0
    cluster: int = 1
    raster: str = "m"

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
            (self.cluster in CLUSTERS, f"cluster (CTAs along the weight rows) must be one of {CLUSTERS}"),
            (self.raster in RASTERS, f"raster must be one of {RASTERS} (weight tiles or routed-row tiles first)"),
        ], f"MoeSm90aConfig {self.tile}")

    @property
    def layout(self) -> str:
        return "sm90a"

    @property
    def threads(self) -> int:
        return 384  # one producer warpgroup + two consumer warpgroups

    @functools.cached_property
    def kernel(self) -> "MoeSm90aConfig":
        """The compiled identity: the zero mode folded, the stage and raster (launch-time choices) at
        their defaults."""
        return dataclasses.replace(self, zero_mode="int", stage="w13", raster="m")

    @functools.cached_property
    def _tile_schedule(self) -> str:
        tm, tn, tk = self.tile
        return f"t{tm}x{tn}x{tk}_s{self.stages}" + (f"_c{self.cluster}" if self.cluster != 1 else "")

    @functools.cached_property
    def kernel_name(self) -> str:
        return f"mg_moe_sm90a_{self.dtype}_u{self.bits}_{self._tile_schedule}"

    @functools.cached_property
    def schedule(self) -> str:
        return f"{self.stage}_{self._tile_schedule}" + (f"_r{self.raster}" if self.raster != "m" else "")

    @functools.cached_property
    def name(self) -> str:
        return f"mg_moe_sm90a_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "MoeSm90aConfig":
        stage, tm, tn, tk, stages, cluster, raster = schedule_fields(
            _SCHEDULE, schedule, "a moe_sm90a",
            "<w13|w2>_t<TM>x<TN>x<TK>_s<stages>[_c<cluster>][_r<m|n>]")
        config = cls(dtype=dtype, bits=bits, zero_mode=zero_mode, stage=stage, tile=(int(tm), int(tn), int(tk)),
                     stages=int(stages), cluster=int(cluster or 1), raster=raster or "m")
        return one_spelling(config, schedule, "a moe_sm90a")  # one spelling per config: "_c1", "_rm" are the defaults, left out

    def replace(self, **changes) -> "MoeSm90aConfig":
        return dataclasses.replace(self, **changes)
