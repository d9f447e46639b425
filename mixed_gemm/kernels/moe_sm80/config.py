"""``MoeSm80Config``: the frozen configuration of the grouped mma.sync MoE family, its single source
of truth: name, rendered source, build-cache key and schedule derive from it."""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, raise_on, schedule_fields
from ..sm80.config import Sm80Config

_SCHEDULE = re.compile(r"^(w13|w2)_t(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)x(\d+)_s(\d+)(_f)?$")
STAGES = ("w13", "w2")


@hash_once
@dataclass(frozen=True)
class MoeSm80Config:
    """One launch configuration of the grouped Ampere kernel (templates/moe_sm80/): the sm80 family's
    multistage mma.sync tile reading the stacked sm90a-layout experts, a CTA per BM-row tile of one
    expert's routed rows.

    Compiled in: ``dtype``, ``bits``, ``tile`` = (BM routed rows, BN weight rows, BK), ``warps``
    (M, N, K), ``stages``: exactly an :class:`~mixed_gemm.kernels.sm80.config.Sm80Config` on the
    sm90a layout (:attr:`tile_config`), whose rules it inherits; ``fused``: the tile reads its A rows
    through the sorted order (the gather fused into the cp.async loads: gate|up reads x's rows, down
    h's) and the down kernel adds each row, times its fp32 top-k weight, into its token's fp32 output
    row (atomics; the combine kernel is gone, and for top-k > 2 the fp32 sum's order varies). Chosen
    at launch: ``stage`` (``"w13"``: gate|up, then SiLU(gate) * up; ``"w2"``: down, then the top-k
    weighted sum). ``zero_mode`` is folded into the additive zero at prepack. ``schedule``
    (``w13_t64x128x64_w2x2x1_s4``, ``_f`` appended when fused) is what a profile stores (as
    ``moe_sm80:<schedule>``)."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    stage: str = "w13"
    tile: Tuple[int, int, int] = (64, 128, 64)
    warps: Tuple[int, int, int] = (2, 2, 1)
    stages: int = 4
    fused: bool = False

    family = "moe_sm80"

    def __post_init__(self) -> None:
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode) + [
            (self.stage in STAGES, f"stage must be one of {STAGES} (gate|up or down)"),
            (isinstance(self.fused, bool), "fused must be a bool (gather and top-k sum in the kernel)"),
        ], f"MoeSm80Config {self.tile}/{self.warps}")
        if self.fused and not self.gathers_whole_rows:
            raise ValueError(f"MoeSm80Config {self.tile}/{self.warps}: fused: a pass of the CTA's threads must copy "
                             "whole rows of A, 8 rows apart (BK / 8 * 8 divides the threads, which divide BM * BK / 8)")
        self.tile_config  # the tile's own rules (raises with them)

    @property
    def layout(self) -> str:
        return "sm90a"

    @functools.cached_property
    def tile_config(self) -> Sm80Config:
        """The dense sm80 config of the same tile on the one copy: the kernel body it runs."""
        return Sm80Config(dtype=self.dtype, bits=self.bits, zero_mode="int", tile=self.tile, warps=self.warps,
                          stages=self.stages, layout="sm90a")

    @property
    def gathers_whole_rows(self) -> bool:
        """The kernel's planned copies (kPlanned): what the fused gather needs."""
        chunks = self.tile[2] // 8
        return self.threads % chunks == 0 and (self.threads // chunks) % 8 == 0 and \
            (self.tile[0] * chunks) % self.threads == 0

    @property
    def threads(self) -> int:
        return self.tile_config.threads

    @property
    def smem_bytes(self) -> int:
        return self.tile_config.smem_bytes

    @functools.cached_property
    def kernel(self) -> "MoeSm80Config":
        """The compiled identity: the zero mode folded, the stage (a launch-time choice) at its default."""
        return dataclasses.replace(self, zero_mode="int", stage="w13")

    @functools.cached_property
    def _tile_schedule(self) -> str:
        (bm, bn, bk), (wm, wn, wk) = self.tile, self.warps
        return f"t{bm}x{bn}x{bk}_w{wm}x{wn}x{wk}_s{self.stages}" + ("_f" if self.fused else "")

    @functools.cached_property
    def kernel_name(self) -> str:
        return f"mg_moe_sm80_{self.dtype}_u{self.bits}_{self._tile_schedule}"

    @functools.cached_property
    def schedule(self) -> str:
        return f"{self.stage}_{self._tile_schedule}"

    @functools.cached_property
    def name(self) -> str:
        return f"mg_moe_sm80_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "MoeSm80Config":
        stage, *nums, fused = schedule_fields(
            _SCHEDULE, schedule, "a moe_sm80",
            "<w13|w2>_t<BM>x<BN>x<BK>_w<WM>x<WN>x<WK>_s<stages>")
        bm, bn, bk, wm, wn, wk, stages = map(int, nums)
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, stage=stage, tile=(bm, bn, bk), warps=(wm, wn, wk),
                   stages=stages, fused=fused is not None)

    def replace(self, **changes) -> "MoeSm80Config":
        return dataclasses.replace(self, **changes)
