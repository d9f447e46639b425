"""``MoeGemvConfig``: the frozen configuration of the grouped MoE decode family (pair mode, expert
mode and persistent mode), its single source of truth: name, rendered source, build-cache key and schedule
derive from it."""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, raise_on, schedule_fields

_SCHEDULE = re.compile(r"^(w13|w2)_s(\d+)_w(\d+)x(\d+)_u(\d+)(?:_m(\d+)_(xe|pe1|pe))?(_ds)?(_tp)?(_sw)?(?:_split(\d+))?(_kloop)?$")
STAGES = ("w13", "w2")
MAX_SPLITS = 32
MAX_THREADS = 512
MAX_STATIC_SMEM = 48 * 1024  # the kernel's shared memory is static
GRID_Z = 65535               # CUDA's grid.z limit: pairs (w13) or tokens (w2) beyond it take more launches
EXPERT_TOKENS = (8, 16)      # expert mode: rows of x per CTA and weight pass (one or two mma n8 tiles)
SCAN_PER_THREAD = 4          # expert mode: ids a thread loads per scan round (MoeGemvExpert::kScanPer)
# Persistent mode (MoeGemvPersistent): the routing is sorted in each CTA's shared memory (dynamic,
# sized per launch: route_bytes), so pairs and experts are bounded; top-k slots are a 32-bit mask.
PERSISTENT_MAX_PAIRS = 8192
PERSISTENT_MAX_EXPERTS = 1024
PERSISTENT_MAX_TOP_K = 32
ROUTE_SCRATCH_WORDS = 2 * 16 + 2  # MoeGemvPersistent::route_words: per-warp partials (16 warps) + 2
FUSED_CLAIM_BYTES = 16  # one-launch persistent mode (MoeGemvFused): the claimed work item, in shared memory
# torch dtype name of the down projection's top-k weights -> MoeGemvArgs::weights_dtype (mixed_gemm::kMoeWeight*,
# templates/moe_gemv/moe_gemv.cuh; checked by weight_constant_checks). Pair and persistent modes read all
# three; expert mode fp32 only (the launcher's native_weights).
WEIGHT_ELEMENTS = {"float32": 0, "float16": 1, "bfloat16": 2}


def weight_constant_checks():
    """``(C++ expression, Python value)`` pairs of :data:`WEIGHT_ELEMENTS`, for the rendered sources."""
    names = {"float32": "kMoeWeightF32", "float16": "kMoeWeightF16", "bfloat16": "kMoeWeightBf16"}
    return [(f"mixed_gemm::{names[k]}", v) for k, v in WEIGHT_ELEMENTS.items()]


def route_bytes(experts: int, pairs: int) -> int:
    """Persistent mode's routing area in shared memory (``MoeGemvPersistent::route_words`` x 4):
    bucket offsets (E + 2), cursors (E + 1), the touched experts (E), the scan's scratch, the
    sorted pairs."""
    return 4 * ((experts + 2) + (experts + 1) + experts + ROUTE_SCRATCH_WORDS + pairs)


@hash_once
@dataclass(frozen=True)
class MoeGemvConfig:
    """One launch configuration of the grouped decode kernels (templates/moe_gemv/).

    Compiled in: ``dtype``, ``bits`` (the sm90a layout folds every zero mode into its additive zero,
    so ``zero_mode`` is not), ``stage``: ``"w13"`` (gate|up with SiLU(gate) * up fused: each warp
    owns ``strips`` gate strips of 16 rows and the up strips ``I/16`` strips further) or ``"w2"``
    (down, the top-k weighted sum over slots fused); ``strips`` (16-row output strips per warp);
    ``warps`` = (warps along the outputs, warps splitting K inside a CTA); ``unroll`` (k16 atoms a
    warp loads before it converts any). One row of x per CTA (pair mode: the FMA variant of
    templates/gemv/gemv.cuh for one token) in pair mode, or with ``deferred`` (``_ds``, pair mode
    only) gemv's mma path on one n8 tile with the group's scale and zero applied to the fp32 sums once
    per group (templates/atoms/deferred.cuh: the dense decode kernels' ``_ds``; fewer instructions
    per weight byte than converting and scaling every weight for one token's FMAs); ``touch_pages``
    (``_tp``, pair mode's gate|up only): each CTA first prefetches one L2 line per 2 MB page of its
    K slice of the expert, so the slice's address translations start together instead of one page
    at a time as the CTAs' common k-walk reaches them (``MoeGemv::touch_pages``); ``slot_warps``
    (``_sw``, pair mode's down only: ``MoeGemvSlotWarps``, templates/moe_gemv/moe_slot_warps.cuh):
    the CTA's K warps spread over ``min(top_k, warps[1])`` top-k slots (:meth:`slot_group`), each
    slot's ``warps[1] // slots`` warps over contiguous pieces of K, the weighted slots added in the
    CTA's reduction (no planes while one group and one slice cover a token); ``by_expert`` (``_m<tokens>_xe``: expert
    mode, ``MoeGemvExpert``): grid.z indexes experts, each CTA scans the routing for its expert's
    pairs and serves ``tokens`` (8 or 16, gemv's meaning: rows of x per CTA, mma n8 tiles) of them
    per pass over the expert's weight, x rows gathered and staged in shared memory; ``persistent``
    (``_m<tokens>_pe``: persistent mode, ``MoeGemvPersistent``): a grid of resident CTAs walks the
    work items (touched expert, row tile, K slice), each CTA sorting the routing in its shared
    memory and serving all of the item's expert's pairs, ``tokens`` rows per pass (expert mode's
    main loop); pair mode has ``tokens == 1``. ``fused`` (``_m<tokens>_pe1``: persistent mode in one
    launch, ``MoeGemvFused``): one kernel runs both projections, gate|up items then down items from
    one atomic work queue, a down item waiting on its expert's gate|up items; its compiled identity
    holds both stages (``kernel`` and ``kernel_name`` are stage-free: the gate|up and down configs of
    a plan share it, and must share the tile: ``MoeGemvFamily.plan_rules``). At launch: ``splits``, K slices across CTAs (grid.y; added in slice order in
    the kernel), and for pair mode's ``w2`` ``slot_loop`` (``_kloop``: each CTA adds all top-k
    slots of its token itself, instead of one CTA per slot whose fp32 planes the last arrival adds
    in slot order). ``schedule`` (``w13_s2_w4x1_u8_split2``, ``w2_s1_w4x2_u8_m16_xe_split2``) is what
    a profile would store (as ``moe_gemv:<schedule>``).
    """

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    stage: str = "w13"
    strips: int = 2
    warps: Tuple[int, int] = (4, 1)
    unroll: int = 8
    tokens: int = 1
    by_expert: bool = False
    persistent: bool = False
    fused: bool = False
    deferred: bool = False
    touch_pages: bool = False
    slot_warps: bool = False
    splits: int = 1
    slot_loop: bool = False

    family = "moe_gemv"

    def __post_init__(self) -> None:
        wn, wk = self.warps
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode) + [
            (self.stage in STAGES, f"stage must be one of {STAGES} (gate|up with SiLU * up, or down with the "
                                   "top-k weighted sum)"),
            (1 <= self.strips <= 8, "strips must be in [1, 8]"),
            (wn >= 1 and wk >= 1 and 32 * wn * wk <= MAX_THREADS, f"warps: at most {MAX_THREADS} threads"),
            (self.unroll in (1, 2, 4, 8, 16, 32),
             "unroll must be a power of two <= 32 (the step's weight and x fragments live in registers)"),
            (1 <= self.splits <= MAX_SPLITS, f"splits must be in [1, {MAX_SPLITS}]"),
            (not (self.by_expert and self.persistent), "by_expert (_xe) and persistent (_pe) are two modes: one at most"),
            (self.persistent or not self.fused, "fused (_pe1: both projections in one launch) is a persistent mode"),
            (self.tokens in (EXPERT_TOKENS if self.by_expert or self.persistent else (1,)),
             f"tokens must be one of {EXPERT_TOKENS} in expert mode (by_expert, _xe) and persistent mode (_pe) "
             "(mma n8 tiles) and 1 in pair mode (one pair per CTA)"),
            (not (self.deferred and self.tiled),
             "deferred (_ds: the mma path with the group's parameters applied to the sums) is pair mode's"),
            (not self.touch_pages or (self.stage == "w13" and not self.tiled),
             "touch_pages (_tp: a prefetch per 2 MB page of the K slice before the main loop) is pair mode's "
             "gate|up (stage w13)"),
            (self.stage == "w2" or not self.slot_loop, "slot_loop (_kloop) is the down projection's (stage w2)"),
            (not self.slot_warps or (self.stage == "w2" and not self.tiled and not self.slot_loop and wk >= 2),
             "slot_warps (_sw: the K warps spread over top-k slots) is pair mode's down (stage w2) with at least two "
             "K warps, without slot_loop (_kloop)"),
            (not ((self.by_expert or self.persistent) and self.slot_loop),
             "slot_loop (_kloop) is pair mode's: in expert and persistent mode a token's slots lie in different "
             "experts' CTAs"),
            (self.smem_bytes <= MAX_STATIC_SMEM, f"shared memory {self.smem_bytes} B above the static {MAX_STATIC_SMEM} B"),
        ], "MoeGemvConfig")

    @property
    def layout(self) -> str:
        return "sm90a"

    @property
    def gated(self) -> bool:
        return self.stage == "w13"

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1]

    @property
    def rows(self) -> int:
        """Outputs per CTA: columns of h (w13; twice as many weight rows) or of y (w2)."""
        return 16 * self.strips * self.warps[0]

    @property
    def accumulators(self) -> int:
        """fp32 accumulators per lane: rows g and g + 8 of each strip it loads (w13: gate and up), for
        one token (pair mode's FMAs) or 4 per n8 tile (the mma of expert, persistent and deferred mode)."""
        per = 4 * (self.tokens // 8) if self.tiled else 4 if self.deferred else 2
        return per * self.strips * (2 if self.gated else 1)

    @property
    def step(self) -> int:
        """K atoms (of 16) a CTA consumes per step of its warps."""
        return self.unroll * self.warps[1]

    @property
    def smem_bytes(self) -> int:
        """Static shared memory: the cross-warp K reduction buffer (gemv's); expert mode adds each
        warp's staged x slice (``tokens`` rows of ``unroll`` atoms, padded by 16 bytes: gemv's XStage)
        and the routing scan's ints (the chunk's entries, rows and arrivals, per-warp counts)."""
        if self.fused:  # both stages' code in one kernel: the larger area, then the claimed item
            return max(self.replace(fused=False, stage=s).smem_bytes for s in STAGES) + FUSED_CLAIM_BYTES
        wn, wk = self.warps
        reduce = (wk - 1) * wn * self.accumulators * 32 * 4
        if not self.tiled:
            return reduce
        stage = wn * wk * self.tokens * (self.unroll * 32 + 16)
        if self.persistent:  # the chunk's rows (src, pair, last, mask); the routing is per launch (route_bytes)
            return reduce + stage + 4 * 4 * self.tokens
        scan = 4 * (3 * self.tokens + SCAN_PER_THREAD * wn * wk)
        return reduce + stage + scan

    @property
    def tiled(self) -> bool:
        """Expert or persistent mode: gathered rows of x on mma n8 tiles (``tokens`` per pass)."""
        return self.by_expert or self.persistent

    def launch_smem(self, experts: int, pairs: int) -> int:
        """Persistent mode's dynamic shared memory for one launch: the kernel's own and the routing's."""
        return self.smem_bytes + route_bytes(experts, pairs)

    @property
    def max_smem(self) -> int:
        """Persistent mode: the most dynamic shared memory a launch takes (the function's opt-in)."""
        return self.launch_smem(PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS) if self.persistent else 0

    @functools.cached_property
    def kernel(self) -> "MoeGemvConfig":
        """The compiled identity: launch-time fields at their defaults, the zero mode folded (and,
        fused, the stage: one kernel runs both)."""
        stage = "w13" if self.fused else self.stage
        return dataclasses.replace(self, zero_mode="int", stage=stage, splits=1, slot_loop=False)

    @functools.cached_property
    def _tile_schedule(self) -> str:
        wn, wk = self.warps
        return (f"{self.stage}_s{self.strips}_w{wn}x{wk}_u{self.unroll}"
                + (f"_m{self.tokens}_xe" if self.by_expert
                   else f"_m{self.tokens}_pe{'1' if self.fused else ''}" if self.persistent else "")
                + ("_ds" if self.deferred else "") + ("_tp" if self.touch_pages else "")
                + ("_sw" if self.slot_warps else ""))

    @functools.cached_property
    def kernel_name(self) -> str:
        tile = self._tile_schedule.split("_", 1)[1] if self.fused else self._tile_schedule  # fused: stage-free
        return f"mg_moe_{self.dtype}_u{self.bits}_{tile}"

    @functools.cached_property
    def schedule(self) -> str:
        return (self._tile_schedule + (f"_split{self.splits}" if self.splits > 1 else "")
                + ("_kloop" if self.slot_loop else ""))

    @functools.cached_property
    def name(self) -> str:
        return f"mg_moe_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "MoeGemvConfig":
        stage, s, wn, wk, u, tokens, mode, ds, tp, sw, sp, kloop = schedule_fields(
            _SCHEDULE, schedule, "a moe_gemv",
            "<w13|w2>_s<strips>_w<N>x<K>_u<unroll>"
            "[_m<tokens>_xe|_m<tokens>_pe|_m<tokens>_pe1][_ds][_tp][_sw][_split<S>][_kloop]")
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, stage=stage, strips=int(s), warps=(int(wn), int(wk)),
                   unroll=int(u), tokens=int(tokens or 1), by_expert=mode == "xe", persistent=mode in ("pe", "pe1"), fused=mode == "pe1",
                   deferred=bool(ds), touch_pages=bool(tp), slot_warps=bool(sw), splits=int(sp or 1),
                   slot_loop=bool(kloop))

    def replace(self, **changes) -> "MoeGemvConfig":
        return dataclasses.replace(self, **changes)

    def slot_group(self, top_k: int) -> Tuple[int, int]:
        """The down projection's ``(slots a CTA adds, slot groups per token)`` (grid.y = groups x
        splits): all top-k slots in one CTA with ``_kloop``, the K warps' share with ``_sw`` (at most
        one slot per K warp), else one slot per CTA."""
        if self.slot_loop:
            return top_k, 1
        slots = min(top_k, self.warps[1]) if self.slot_warps else 1
        return slots, -(-top_k // slots)

    def steps(self, k: int) -> int:
        """CTA steps (of ``step`` k16 atoms) that cover ``k``: the most splits that each get work."""
        return -(-(-(-k // 16)) // self.step)

    def launch_geometry(self, n: int, k: int) -> Tuple[int, int, int, int]:
        """``(row tiles, splits, chunk, strips)`` for a stacked ``(n, k)`` expert weight (``n``: 2I
        for w13, H for w2): the CTAs along the outputs (I for w13, H for w2), the K slices (each
        non-empty: ``chunk`` k16 atoms, a multiple of ``unroll``), and the weight's 16-row strips."""
        strips = -(-n // 16)
        outputs = n // 2 if self.gated else n
        row_tiles = -(-(-(-outputs // 16)) // (self.strips * self.warps[0]))
        katoms = -(-k // 16)
        chunk = -(-katoms // self.splits)
        chunk = -(-chunk // self.unroll) * self.unroll
        return row_tiles, -(-katoms // chunk), chunk, strips

    def persistent_items(self, tokens: int, top_k: int, experts: int, n: int, k: int) -> int:
        """Persistent mode: the most work items a routing of ``tokens`` x ``top_k`` pairs can make,
        from shapes alone: (touched experts, at most ``min(E, pairs)``) x row tiles x K slices."""
        row_tiles, splits, _, _ = self.launch_geometry(n, k)
        return min(experts, tokens * top_k) * row_tiles * splits

    def expert_chunks(self, tokens: int, experts: int) -> int:
        """Expert mode: chunk slots per expert on grid.z (``experts * chunks`` CTAs along z), from
        shapes alone: ``ceil(tokens / self.tokens)``, the most chunks an expert has when each token's
        top-k experts are distinct, capped by CUDA's grid.z limit. A CTA serves slots ``c, c +
        chunks, ...``, so routings beyond the bound (repeated ids, the cap) are still covered."""
        return max(1, min(-(-max(1, tokens) // self.tokens), GRID_Z // max(1, experts)))
