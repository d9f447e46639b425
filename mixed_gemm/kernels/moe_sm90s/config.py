"""``MoeSm90sConfig``: the frozen configuration of the grouped sm90s family, its single source of
truth: name, rendered source, build-cache key and schedule derive from it."""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, one_spelling, raise_on, schedule_fields
from ..sm90s.config import MAX_SPLITS, SMEM_PER_CTA, TILE_M, TILE_MS, Sm90sConfig

_SCHEDULE = re.compile(r"^(w13|w2)_t(\d+)x(\d+)x(\d+)_s(\d+)(_hi)?(_g)?(_se)?(?:_split(\d+))?(_p)?(_f)?$")
STAGES = ("w13", "w2")
GATHER_ROW_BYTES = 8  # the gather's offset of one x row in shared memory (a long long)
STAGED_PAD = 16  # the staged epilogue's pad a token row (Geometry::kStagedPitch = 64 * 2 + this, a warpgroup's rows)
# The dense family's weight-row tiles of two or more consumer warpgroups (its one-warpgroup tile
# runs a whole 64-row tile per CTA, not a grouped work item).
GROUPED_TILE_MS = tuple(m for m in TILE_MS if m >= TILE_M)


@hash_once
@dataclass(frozen=True)
class MoeSm90sConfig:
    """One launch configuration of the grouped sm90s kernel (templates/moe_sm90s/): the dense
    sm90s mainloop (register-A wgmma, the weight as operand A, the tokens as wgmma N) over every
    expert's block of sorted rows, one CTA per (K slice, weight-row tile, token tile of an expert).

    Compiled in: ``dtype``, ``bits``, ``tile`` = (TM weight rows: 128, or 192 / 256 with three / four
    consumer warpgroups; TN routed rows in {16, 32, 48, 64, 80, 96, 112, 128}; TK 128, or 64 for 256 x 128), ``stages`` (0: as many as fit),
    ``half_issue`` (``_hi``: the dense family's, where the tile has one fragment set, i.e. TM = 256
    from TN = 32: a k-tile's wgmmas in two halves, the second converting under the first), ``gather``
    (``_g``, the gate|up stage only: the producer warpgroup reads each routed row of x by index with
    16-byte cp.async into the swizzled stage, so no gathered copy of x is written and read back;
    the others read a box of the gathered rows with TMA), ``staged`` (``_se``: the epilogue writes the
    tile's rows into shared memory, a consumer warpgroup's 64 rows each, and stores them back as
    whole row segments, not 16 bytes of 8 tokens a warp instruction; its buffer, TM/64 x TN x 144 bytes,
    takes ring stages; one K slice).
    At launch:
    ``stage`` (``"w13"``: the gate|up GEMM storing SiLU(gate) * up; ``"w2"``: the down GEMM, then the
    top-k sum), ``splits`` (K slices, summed in the kernel in slice order), ``persistent`` (``_p``) and
    ``combine`` (``_f``, the down stage: the top-k sum in the epilogue, each row times its pair's
    weight added into the token's fp32 row with vector reductions, no stored rows and no combine
    pass; for top-k > 2 the fp32 sum's order, and so its last bits, may vary between runs). The tile rules are
    the dense family's (:class:`~mixed_gemm.kernels.sm90s.Sm90sConfig`, one CTA per SM, no
    cluster). ``schedule``: ``w13_t128x16x128_s0`` (``_split<S>`` where S > 1), stored in profiles as
    ``moe_sm90s:<schedule>``."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    stage: str = "w13"
    tile: Tuple[int, int, int] = (128, 16, 128)
    stages: int = 0
    half_issue: bool = False
    splits: int = 1
    persistent: bool = False
    gather: bool = False
    combine: bool = False
    staged: bool = False

    family = "moe_sm90s"

    def __post_init__(self) -> None:
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode) + [
            (self.stage in STAGES, f"stage must be one of {STAGES} (gate|up or down)"),
            (self.tile[0] in GROUPED_TILE_MS,
             f"tile M (weight rows) must be one of {GROUPED_TILE_MS} (the dense family's 64-row tile is not a "
             "grouped one)"),
            (self.tile[1] in (16, 32, 48, 64, 80, 96, 112, 128),
             "tile N (routed rows per CTA) must be 16, 32, 48, 64, 80, 96, 112 or 128"),
            (1 <= self.splits <= MAX_SPLITS, f"splits must be in [1, {MAX_SPLITS}]"),
            (isinstance(self.persistent, bool), "persistent must be a bool"),
            (isinstance(self.gather, bool), "gather must be a bool"),
            (not self.gather or self.stage == "w13",
             "gather (_g: x's rows read by index) is the gate|up stage's: the down stage reads h in sorted order"),
            (isinstance(self.combine, bool), "combine must be a bool"),
            (isinstance(self.staged, bool), "staged must be a bool"),
            (not self.staged or self.splits == 1,
             "staged (_se: the tile through shared memory) takes one K slice: split-K's slices finish a tile warp "
             "by warp, and the staged store waits for all of the CTA's consumer warps"),
            (not self.combine or self.stage == "w2",
             "combine (_f: the top-k sum in the epilogue) is the down stage's: gate|up stores h"),
        ], f"MoeSm90sConfig {self.tile}")
        self.dense  # the dense family's rules for the tile, the stages and the shared memory
        raise_on([(self.smem_bytes <= SMEM_PER_CTA[1], f"shared memory {self.smem_bytes} B above {SMEM_PER_CTA[1]} B "
                                                      "with the gather's row offsets or the staged epilogue's "
                                                      "buffer: fewer stages")],
                 f"MoeSm90sConfig {self.tile}")

    @functools.cached_property
    def dense(self) -> Sm90sConfig:
        """The dense sm90s config of the same compiled tile (its geometry: stages, shared memory);
        with the staged epilogue's buffer, stages=0 takes as many as fit beside it."""
        dense = Sm90sConfig(dtype=self.dtype, bits=self.bits, tile=self.tile, stages=self.stages,
                            half_issue=self.half_issue)
        if self.staged and not self.stages:
            return dense.replace(stages=dense.stages_fitting(self.extra_smem_bytes))
        return dense

    @property
    def layout(self) -> str:
        return "sm90a"

    @property
    def threads(self) -> int:
        return self.dense.threads

    @property
    def pipeline_stages(self) -> int:
        return self.dense.pipeline_stages

    @property
    def extra_smem_bytes(self) -> int:
        """Beside the dense tile's: the gather's x row offsets (Geometry::kGatherBytes) and the staged
        epilogue's buffer (kStagedBytes)."""
        tm, tn, _ = self.tile
        staged = (tm // 64) * tn * (2 * 64 + STAGED_PAD) if self.staged else 0
        return (GATHER_ROW_BYTES * tn if self.gather else 0) + staged

    @property
    def smem_bytes(self) -> int:
        return self.dense.smem_bytes + self.extra_smem_bytes

    @functools.cached_property
    def kernel(self) -> "MoeSm90sConfig":
        """The compiled identity: zero mode folded, the launch-time choices (stage, split factor,
        persistent grid, combine) at their defaults."""
        return dataclasses.replace(self, zero_mode="int", stage="w13", splits=1, persistent=False, combine=False)

    @functools.cached_property
    def _tile_schedule(self) -> str:
        tm, tn, tk = self.tile
        return (f"t{tm}x{tn}x{tk}_s{self.stages}" + ("_hi" if self.half_issue else "") + ("_g" if self.gather else "")
                + ("_se" if self.staged else ""))

    @functools.cached_property
    def kernel_name(self) -> str:
        return f"mg_moe_sm90s_{self.dtype}_u{self.bits}_{self._tile_schedule}"

    @functools.cached_property
    def schedule(self) -> str:
        return (f"{self.stage}_{self._tile_schedule}" + (f"_split{self.splits}" if self.splits > 1 else "")
                + ("_p" if self.persistent else "") + ("_f" if self.combine else ""))

    @functools.cached_property
    def name(self) -> str:
        return f"mg_moe_sm90s_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "MoeSm90sConfig":
        stage, tm, tn, tk, stages, hi, g, se, splits, persistent, f = schedule_fields(
            _SCHEDULE, schedule, "a moe_sm90s",
            "<w13|w2>_t<TM>x<TN>x<TK>_s<stages>[_hi][_g][_se][_split<S>][_p][_f]")
        config = cls(dtype=dtype, bits=bits, zero_mode=zero_mode, stage=stage, tile=(int(tm), int(tn), int(tk)),
                     stages=int(stages), half_issue=bool(hi), splits=int(splits or 1), persistent=bool(persistent),
                     gather=bool(g), combine=bool(f), staged=bool(se))
        return one_spelling(config, schedule, "a moe_sm90s")

    def replace(self, **changes) -> "MoeSm90sConfig":
        return dataclasses.replace(self, **changes)
