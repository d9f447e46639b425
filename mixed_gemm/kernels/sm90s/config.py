"""``Sm90sConfig``: the frozen configuration of the sm90s family, its single source of truth.

Name, rendered source, build-cache key and profile key all derive from a config.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from ..common import check_weight_kind, hash_once, raise_on, schedule_fields

_SCHEDULE = re.compile(r"^t(\d+)x(\d+)x(\d+)_c(\d)x(\d)_o(\d)_s(\d+)(_ph)?(_hi)?(_ov)?_(dp|auto|sk|split(\d+))$")
TILE_M = 128            # two consumer warpgroups of 64 weight rows (one wgmma m64 each)
TILE_MS = (64, 128, 192, 256)  # 64: one consumer warpgroup; 192, 256: three, four behind one producer (Geometry's TM)
# At TM = 256 a consumer thread has 112 registers: TN/2 accumulators and one set of TK/4 fragment
# registers must stay within 80 (t256x128x128 spills 92 bytes in the k-loop; t256x128x64 none).
# At TM = 192 it has 160: the same 32 to spare give 128 for one set; two sets (the double buffer)
# need TN/2 + TK/2 <= 96 (t192x128x128 with two spilled 360 bytes).
TM_MAX_LIVE = {256: 80, 192: 128}
TM192_DOUBLE_LIVE = 96
TM_ROW_CLUSTER = {256: 1, 192: 2}   # the largest Cx1 cluster each takes (192: 16 clusters of 2 over 6144 rows)
TILE_NS = (16, 32, 48, 64, 80, 96, 112, 128, 256)  # wgmma N of the RsOp specializations (48-112: grouped ragged rows)
TILE_KS = (64, 128)
# (C, 1): C adjacent row tiles share their x tile, each CTA loading TN/C token rows of it with TMA
# multicast into all C. (1, S): the S K slices of one tile, their partials summed in the first
# one's shared memory (Geometry::kClusterK).
ROW_CLUSTERS = ((1, 1), (2, 1), (4, 1))
K_CLUSTERS = ((1, 2), (1, 4))
CLUSTERS = ROW_CLUSTERS + K_CLUSTERS
X_ATOM_ROWS = 8         # a 128-byte swizzle atom is 8 rows of 128 bytes: a CTA's x part fills whole ones
MAX_STAGES = 12
AUTO_STAGES = 8         # the deepest ring stages=0 picks
MAX_SPLITS = 16
MIN_K_TILES = 2         # k-tiles each split keeps at least (auto)
# Share of an H100's CTA slots that whole clusters of 4 keep (cudaOccupancyMaxActiveClusters,
# measured 2026-11-28 on 132 SMs: 30 clusters at one CTA per SM, 62 at two; a GPC's SMs are not a
# multiple of 4). Clusters of 2 keep every slot (66 and 132). The launcher asks the device itself.
CLUSTER4_SLOTS = {1: 120 / 132, 2: 248 / 264}
# Shared memory one CTA may take (H100: 227 KB opt-in; two CTAs share 228 KB, less 1 KB each).
SMEM_PER_CTA = {1: 227 * 1024, 2: 228 * 1024 // 2 - 1024}
BARRIER_BYTES = 256     # Geometry::kBarrierBytes
ALIGN_SLACK = 1024      # the dynamic shared memory base aligned up to 1024 bytes (x swizzle)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def double_buffered(tile: Tuple[int, int, int], ctas_per_sm: int) -> bool:
    """Does the kernel convert the next k-tile while this one's wgmmas run? (Geometry::kDoubleBuffer,
    static_asserted in every rendered source: a second fragment set fits the consumer's registers.)"""
    tm, tn, tk = tile
    two_sets = tm <= TILE_M or (tm == 192 and tn // 2 + tk // 2 <= TM192_DOUBLE_LIVE)
    return tn <= 128 and ((ctas_per_sm == 1 and two_sets) or tn <= 16)


@hash_once
@dataclass(frozen=True)
class Sm90sConfig:
    """One launch configuration of the sm90s kernel (templates/sm90s/, the serving-regime mainloop
    of docs/notes/serving-mainloop.md): register-A wgmma with the weight as operand A.

    Compiled in: ``dtype``, ``bits``, ``tile`` = (TM = 128 weight rows, or 256 with four consumer
    warpgroups at one CTA per SM, no row cluster and TN/2 + TK/4 <= 80, or 192 with three, <= 128
    and up to a 2x1 cluster, or 64 with one consumer warpgroup and no row cluster or phase offset;
    TN tokens in
    {16, 32, 48, 64, 80, 96, 112, 128, 256}, TK in {64, 128}), ``cluster`` ((1, 1), (2, 1) or (4, 1): C CTAs of adjacent
    weight-row tiles share one x tile, each loading TN/C token rows of it with TMA multicast into all
    C; TN/C must be a multiple of 8, so (4, 1) needs TN >= 32; or (1, 2), (1, 4): the S K slices of
    one tile, launched as S-way split-K whose partials meet in shared memory, at ``auto`` only),
    ``ctas_per_sm`` (``_o<N>``: compiled with ``__launch_bounds__(128 + 2 TM, N)``; 2 only at
    TN <= 64, where the registers allow it), ``stages`` (0: as many as fit the shared memory of
    ``ctas_per_sm`` CTAs, at most 8) and ``phased`` (``_ph``: an ordered barrier makes the two
    consumer warpgroups take turns issuing their wgmmas, so one converts while the other's run), and
    ``half_issue`` (``_hi``, only where the kernel has one fragment set, :func:`double_buffered`
    false, and no phase offset: each warpgroup issues a k-tile's wgmmas in two halves, the second
    half converting under the first half's wgmmas and, where three half fragment sets fit, the next
    k-tile's first half under both; templates/sm90s/params.cuh, ``kHalfBuffer``), ``in_flight``
    (``_ov``, double-buffered kernels without the phase offset: a warpgroup issues a k-tile's wgmmas
    before waiting for the previous k-tile's, so the tensor pipe gets the next batch before the
    last drains; ``kInFlight``). At
    launch: ``decomposition``, ``"dp"`` (one CTA
    per output tile), ``"split"`` with ``splits`` K slices, or ``"auto"`` (the split factor chosen
    per shape to fill the SMs, :meth:`launch_splits`) or ``"sk"`` (stream-K: a persistent grid of
    one wave, each CTA, or each Cx1 cluster for its C row tiles, taking an equal run of the tiles'
    k-tiles, which may cross tiles; no K cluster, no phase offset); slices and segments are summed
    in the kernel by the last one to finish, in order, with no memset per launch.

    ``zero_mode`` is not compiled in: every mode is the additive zero of the sm90a layout. The
    schedule (``t128x64x128_c1x1_o1_s0_auto``) is what profiles store (as ``sm90s:<schedule>``).
    """

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    tile: Tuple[int, int, int] = (128, 64, 128)
    cluster: Tuple[int, int] = (1, 1)
    ctas_per_sm: int = 1
    stages: int = 0
    phased: bool = False
    half_issue: bool = False
    in_flight: bool = False
    decomposition: str = "auto"
    splits: int = 1

    family = "sm90s"

    def __post_init__(self) -> None:
        tm, tn, tk = self.tile
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode) + [
            (tm in TILE_MS, f"tile M (weight rows) must be one of {TILE_MS}: consumer warpgroups of 64 rows (wgmma m64)"),
            (tm not in TM_MAX_LIVE or (self.ctas_per_sm == 1 and self.cluster[0] <= TM_ROW_CLUSTER[tm]
                                       and not self.phased and tn // 2 + tk // 4 <= TM_MAX_LIVE[tm]),
             f"tile M {tm} ({tm // 64} consumer warpgroups) only at one CTA per SM, row clusters up to "
             f"{TM_ROW_CLUSTER.get(tm)}, no phase offset and TN/2 + TK/4 <= {TM_MAX_LIVE.get(tm)} (accumulators "
             f"and fragments in a consumer thread's registers)"),
            (tm != 64 or (self.cluster[0] == 1 and not self.phased),
             "tile M 64 (one consumer warpgroup) only without a row cluster or phase offset"),
            (tn in TILE_NS, f"tile N (tokens) must be one of {TILE_NS} (wgmma N)"),
            (tk in TILE_KS, f"tile K must be one of {TILE_KS} (64-element swizzle panels of x)"),
            (self.cluster in CLUSTERS, "cluster must be (1, 1), (2, 1) or (4, 1) (x multicast over 2 or 4 row tiles), "
                                       "or (1, 2), (1, 4) (K slices summed in shared memory)"),
            (self.cluster not in K_CLUSTERS or (self.decomposition == "auto" and not self.phased),
             f"cluster {self.cluster} (K slices) is its own split factor: decomposition auto, no phase offset"),
            (self.cluster not in CLUSTERS or tn % (X_ATOM_ROWS * self.cluster[0]) == 0,
             f"cluster {self.cluster} needs tile N a multiple of {X_ATOM_ROWS * self.cluster[0]}: each CTA loads "
             f"TN/{self.cluster[0]} token rows of x, which must fill whole 8-row 128-byte swizzle atoms"),
            (isinstance(self.phased, bool), "phased must be a bool"),
            (isinstance(self.half_issue, bool), "half_issue must be a bool"),
            (not self.half_issue or (not double_buffered(self.tile, self.ctas_per_sm) and not self.phased),
             "half_issue (_hi) only without the double buffer (TN >= 32 at two CTAs per SM or TM = 256, or "
             "TN = 256) and without the phase offset"),
            (isinstance(self.in_flight, bool), "in_flight must be a bool"),
            (not self.in_flight or (double_buffered(self.tile, self.ctas_per_sm) and not self.phased
                                    and not self.half_issue),
             "in_flight (_ov) only with the double buffer (two fragment sets: the next batch's while one runs) "
             "and without the phase offset or half issue"),
            (self.ctas_per_sm in (1, 2), "ctas_per_sm must be 1 or 2"),
            (self.ctas_per_sm == 1 or tn <= 64, "two CTAs per SM only at TN <= 64 (registers)"),
            (self.stages == 0 or 2 <= self.stages <= MAX_STAGES, f"stages must be 0 (auto) or 2..{MAX_STAGES}"),
            (self.decomposition in ("dp", "auto", "sk", "split"), "decomposition must be dp, auto, sk or split"),
            (self.decomposition != "sk" or (self.cluster[1] == 1 and not self.phased),
             "stream-K (sk) only without a K cluster (1xS: its own split) and without the phase offset (its "
             "turn barriers pair the warpgroups over one tile's k-tiles)"),
            ((self.decomposition == "split") == (self.splits > 1), "splits > 1 exactly with decomposition 'split'"),
            (1 <= self.splits <= MAX_SPLITS, f"splits must be in [1, {MAX_SPLITS}]"),
        ], f"Sm90sConfig {self.tile}")
        raise_on([(self.smem_bytes <= SMEM_PER_CTA[self.ctas_per_sm],
                   f"shared memory {self.smem_bytes} B above {SMEM_PER_CTA[self.ctas_per_sm]} B per CTA at "
                   f"{self.ctas_per_sm} CTA(s) per SM: fewer stages")], f"Sm90sConfig {self.tile}")

    # ---- shared memory (templates/sm90s/params.cuh, Geometry: the rendered source asserts equality) ----
    @property
    def stage_bytes(self) -> int:
        """One ring stage: x (TN x TK halves), the weight atoms, up to TK/32 scale and zero rows."""
        tm, tn, tk = self.tile
        return _round_up(tn * tk * 2 + tm * tk * self.bits // 8 + 2 * (tk // 32) * tm * 2, 1024)

    @property
    def reduce_bytes(self) -> int:
        """A 1xS cluster's partials of the other S - 1 slices in the first one's shared memory
        (Geometry::kReduceBytes): fp32 TM x TN each."""
        tm, tn, _ = self.tile
        return (self.cluster[1] - 1) * tm * tn * 4

    def stages_fitting(self, reserved: int = 0) -> int:
        """As many ring stages as fit beside ``reserved`` more bytes of shared memory (a grouped
        tile's gather offsets or staged epilogue), at least 2 and at most AUTO_STAGES."""
        fit = (SMEM_PER_CTA[self.ctas_per_sm] - self.reduce_bytes - BARRIER_BYTES - ALIGN_SLACK - reserved) // self.stage_bytes
        return max(2, min(AUTO_STAGES, fit))

    @property
    def pipeline_stages(self) -> int:
        """``stages``, or for 0 as many as fit (at most AUTO_STAGES)."""
        return self.stages or self.stages_fitting()

    @property
    def smem_bytes(self) -> int:
        return self.pipeline_stages * self.stage_bytes + self.reduce_bytes + BARRIER_BYTES + ALIGN_SLACK

    @property
    def threads(self) -> int:
        """One producer warpgroup and TM/64 consumer warpgroups (Geometry::kThreads)."""
        return 128 + 2 * self.tile[0]

    # ---- identity ----
    @functools.cached_property
    def kernel(self) -> "Sm90sConfig":
        """The compiled identity: zero mode folded (any), launch-time fields at their defaults."""
        return dataclasses.replace(self, zero_mode="int", decomposition="auto", splits=1)

    @functools.cached_property
    def _tile_schedule(self) -> str:
        tm, tn, tk = self.tile
        cm, cn = self.cluster
        return (f"t{tm}x{tn}x{tk}_c{cm}x{cn}_o{self.ctas_per_sm}_s{self.stages}{'_ph' if self.phased else ''}"
                f"{'_hi' if self.half_issue else ''}{'_ov' if self.in_flight else ''}")

    @functools.cached_property
    def kernel_name(self) -> str:
        return f"mg_sm90s_{self.dtype}_u{self.bits}_{self._tile_schedule}"

    @functools.cached_property
    def schedule(self) -> str:
        tail = f"split{self.splits}" if self.decomposition == "split" else self.decomposition
        return f"{self._tile_schedule}_{tail}"

    @functools.cached_property
    def name(self) -> str:
        return f"mg_sm90s_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4, zero_mode: str = "int") -> "Sm90sConfig":
        tm, tn, tk, cm, cn, o, st, ph, hi, ov, tail, sp = schedule_fields(
            _SCHEDULE, schedule, "an sm90s",
            "t<64|128|192|256>x<TN>x<TK>_c<1|2|4>x1_o<1|2>_s<stages>[_ph][_hi][_ov]_<dp|auto|sk|split<S>>")
        decomposition = "split" if sp else tail
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, tile=(int(tm), int(tn), int(tk)),
                   cluster=(int(cm), int(cn)), ctas_per_sm=int(o), stages=int(st), phased=bool(ph),
                   half_issue=bool(hi), in_flight=bool(ov), decomposition=decomposition,
                   splits=int(sp or 1))

    def replace(self, **changes) -> "Sm90sConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    # ---- launch geometry ----
    def tiles(self, m: int, n: int) -> int:
        """Output tiles (CTAs of one K slice): weight-row tiles, rounded up to whole clusters, x
        token tiles."""
        tm, tn, _ = self.tile
        cm = self.cluster[0]
        return -(-n // (tm * cm)) * cm * -(-m // tn)

    def k_tiles(self, k: int) -> int:
        return -(-_round_up(k, 16) // self.tile[2])

    def wave_ctas(self, sms: int) -> int:
        """CTAs of one wave without asking the device: ``sms x ctas_per_sm``, whole clusters of 4
        scaled by CLUSTER4_SLOTS (the launcher's ``slots`` is the device's own count)."""
        slots, size = sms * self.ctas_per_sm, self.cluster[0] * self.cluster[1]
        if size == 4:
            slots = int(slots * CLUSTER4_SLOTS[self.ctas_per_sm]) // 4 * 4
        return slots

    def slices_fit_one_wave(self, m: int, n: int, sms: int) -> bool:
        """A 1xS cluster's S slices of every tile run in one wave of whole clusters (past it the last
        clusters run as a second wave: 8B o at M=16, 32 clusters of 4 where 30 fit, 13.6 against 9.2
        µs); always true of other kernels."""
        return self.cluster[1] == 1 or self.tiles(m, n) * self.cluster[1] <= self.wave_ctas(sms)

    def launch_splits(self, m: int, n: int, k: int, sms: int, slots: Optional[int] = None) -> int:
        """The K slices of a launch (the kernel library drops slices that would get no k-tile).
        ``"auto"``: as many as keep every CTA in the first wave, with at least MIN_K_TILES k-tiles
        each: 32 tiles of a 4096-row weight run as 4 x 32 CTAs on 132 SMs; 112 tiles stay whole (a
        second slice would start a second wave of small CTAs, whose ring fills and partial sums the
        wave count does not see). ``slots``: the CTAs that run at once, by default ``sms x
        ctas_per_sm``; a cluster kernel's launcher passes whole clusters x C (a cluster's CTAs share
        a GPC, so clusters of 4 may leave some of a GPC's SMs idle)."""
        if self.cluster in K_CLUSTERS:
            return self.cluster[1]
        if self.decomposition in ("dp", "sk"):
            return 1
        if self.decomposition == "split":
            return self.splits
        slots = slots or sms * self.ctas_per_sm
        return max(1, min(slots // self.tiles(m, n), self.k_tiles(k) // MIN_K_TILES, MAX_SPLITS))
