"""``Sm90aConfig``: the frozen configuration of the sm90a family, its single source of truth.

Name, rendered source, build-cache key and profile key all derive from a config.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, raise_on, schedule_fields

_SCHEDULE = re.compile(r"^t(\d+)x(\d+)x(\d+)_(coop|pp)_c(\d)x(\d)_s(\d+)(_sk|_dp|_split(\d+))?(?:_sw(\d))?(?:_r([mn]))?$")
KINDS = ("coop", "pp")
SWIZZLES = (1, 2, 4, 8)
RASTERS = ("h", "m", "n")
MAX_SPLITS = 16


@hash_once
@dataclass(frozen=True)
class Sm90aConfig:
    """One launch configuration of the sm90a (Hopper wgmma, CUTLASS 3.x) mixed-input GEMM.

    The kernel computes the transposed problem (weights are operand A): ``tile`` = (TM weight rows,
    TN tokens, TK) per CTA. Compiled into the kernel: ``dtype``, ``bits``, ``tile``, ``kind``
    (``"coop"``: two consumer warpgroups share a tile, TM >= 128; ``"pp"``: ping-pong, one
    warpgroup per tile and two tiles in flight), ``cluster`` (CTAs per cluster along kernel-M,
    kernel-N: (2, 1) shares each activation tile between two weight tiles by TMA multicast),
    ``stages`` (0 = as many as fit), and the tile scheduler: ``decomposition`` ``"persistent"``
    (data-parallel persistent tiles, no workspace) or one of the stream-K scheduler's modes, chosen
    at launch: ``"sk"`` (CUTLASS's stream-K heuristic), ``"dp"`` (data-parallel), ``"split"`` with
    ``splits`` K slices (reduced in the kernel through a workspace).

    Also chosen at launch: the tile order, ``swizzle`` (groups of that many tiles walk the other
    dimension together, for L2 reuse) and ``raster`` (``"h"``: CUTLASS's heuristic, ``"m"``: along
    weight tiles, ``"n"``: along token tiles).

    ``zero_mode`` is not compiled in: every mode is folded into the additive zero at prepack (see
    :mod:`.layout`), so one binary serves all four. ``schedule`` (``t128x64x128_coop_c1x1_s0_split4``)
    is what profiles store (as ``sm90a:<schedule>``) and ``MIXED_GEMM_SCHEDULE`` overrides.
    """

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    tile: Tuple[int, int, int] = (128, 128, 64)
    kind: str = "coop"
    cluster: Tuple[int, int] = (1, 1)
    stages: int = 0
    decomposition: str = "persistent"
    splits: int = 1
    swizzle: int = 1
    raster: str = "h"

    family = "sm90a"

    def __post_init__(self) -> None:
        tm, tn, tk = self.tile
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode) + [
            (self.kind in KINDS, f"kind must be one of {KINDS}"),
            # Scales are loaded by TMA per stage: TM * 2 bytes must be a multiple of 128.
            (tm in (64, 128, 256), "tile M (weight rows) must be 64, 128 or 256"),
            (self.kind == "pp" or tm >= 128, "the cooperative kernel splits tile M over two warpgroups: M >= 128"),
            (8 <= tn <= 256 and tn % 8 == 0, "tile N (tokens) must be a multiple of 8 in [8, 256] (wgmma N)"),
            # The register-A wgmma pipeline needs 4 k16 blocks per stage (collective static_assert).
            (tk in (64, 128), "tile K must be 64 or 128"),
            (self.cluster in ((1, 1), (2, 1), (1, 2)), "cluster must be (1, 1), (2, 1) or (1, 2)"),
            (self.stages == 0 or 2 <= self.stages <= 12, "stages must be 0 (auto) or 2..12"),
            (self.decomposition in ("persistent", "sk", "dp", "split"),
             "decomposition must be persistent, sk, dp or split"),
            (self.decomposition == "persistent" or self.kind == "coop",
             "stream-K / split-K schedulers run only with the cooperative kernel"),
            ((self.decomposition == "split") == (self.splits > 1), "splits > 1 exactly with decomposition 'split'"),
            (1 <= self.splits <= MAX_SPLITS, f"splits must be in [1, {MAX_SPLITS}]"),
            (self.swizzle in SWIZZLES, f"swizzle must be one of {SWIZZLES}"),
            (self.raster in RASTERS, f"raster must be one of {RASTERS}"),
        ], f"Sm90aConfig {self.tile}/{self.kind}")

    @property
    def streamk(self) -> bool:
        """Compiled with the stream-K tile scheduler (which also runs split-K and data-parallel)."""
        return self.decomposition != "persistent"

    @functools.cached_property
    def threads(self) -> int:
        return 384  # one producer warpgroup + two consumer warpgroups, in both kinds

    @functools.cached_property
    def kernel(self) -> "Sm90aConfig":
        """The compiled identity: zero mode folded (any), launch-time fields at their defaults."""
        decomposition = "sk" if self.streamk else "persistent"
        return dataclasses.replace(self, zero_mode="int", decomposition=decomposition, splits=1, swizzle=1, raster="h")

    @functools.cached_property
    def _tile_schedule(self) -> str:
        tm, tn, tk = self.tile
        cm, cn = self.cluster
        return f"t{tm}x{tn}x{tk}_{self.kind}_c{cm}x{cn}_s{self.stages}"

    @functools.cached_property
    def kernel_name(self) -> str:
        """The kernel's symbol and cache name (compiled fields only; no zero mode)."""
        return f"mg_sm90a_{self.dtype}_u{self.bits}_{self._tile_schedule}" + ("_sk" if self.streamk else "")

    @functools.cached_property
    def schedule(self) -> str:
        """Everything but the weight kind: what a profile entry stores."""
        suffix = {"persistent": "", "sk": "_sk", "dp": "_dp"}.get(self.decomposition, f"_split{self.splits}")
        if self.swizzle != 1:
            suffix += f"_sw{self.swizzle}"
        if self.raster != "h":
            suffix += f"_r{self.raster}"
        return self._tile_schedule + suffix

    @functools.cached_property
    def name(self) -> str:
        return f"mg_sm90a_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4, zero_mode: str = "int") -> "Sm90aConfig":
        v = schedule_fields(
            _SCHEDULE, schedule, "an sm90a",
            "t<TM>x<TN>x<TK>_<coop|pp>_c<M>x<N>_s<stages>[_sk|_dp|_split<S>][_sw<1|2|4|8>][_r<m|n>]")
        tail = v[7] or ""
        decomposition = {"": "persistent", "_sk": "sk", "_dp": "dp"}.get(tail, "split")
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, tile=tuple(map(int, v[0:3])), kind=v[3],
                   cluster=(int(v[4]), int(v[5])), stages=int(v[6]), decomposition=decomposition,
                   splits=int(v[8] or 1), swizzle=int(v[9] or 1), raster=v[10] or "h")

    @property
    def launch_splits(self) -> int:
        """The scheduler's ``splits`` argument of the C ABI: 0 stream-K heuristic, 1 data-parallel,
        > 1 split-K (ignored by the persistent scheduler)."""
        return {"sk": 0, "dp": 1, "persistent": 1}.get(self.decomposition, self.splits)

    def replace(self, **changes) -> "Sm90aConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
