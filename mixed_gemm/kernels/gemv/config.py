"""``GemvConfig``: the frozen configuration of the decode (gemv) family, its single source of truth.

Name, rendered source, build-cache key and profile key all derive from a config.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import check_weight_kind, hash_once, raise_on, schedule_fields
from .lowbit_layout import BITS as LOWBIT_BITS, block_atoms, words as lowbit_words

_SCHEDULE = re.compile(r"^m(\d+)_s(\d+)_w(\d+)x(\d+)_u(\d+)(_xs)?(_sm80)?(?:_p(\d+))?(_ds)?(?:_o(\d+))?(?:_split(\d+))?$")
LAYOUTS = ("sm90a", "sm80", "lowbit")
TOKENS = (1, 2, 4, 8, 16, 32)
MAX_SPLITS = 32
MAX_THREADS = 512
MAX_STATIC_SMEM = 48 * 1024  # the kernel's shared memory is static up to here (without a ring)
# A ring's, or x stages above MAX_STATIC_SMEM, are dynamic: the H100's opt-in limit per CTA (the
# runtime checks the device's).
MAX_RING_SMEM = 227 * 1024
STAGES = (0, 2, 3, 4)  # 0: no ring (gemv.cuh); else the cp.async ring's depth (gemv_pipe.cuh)


@hash_once
@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration of the decode kernels (templates/gemv/).

    Compiled in: ``dtype``, ``bits``; ``layout``, the weight layout read: ``"sm90a"`` (gemv.cuh:
    the weight is the A operand, every zero mode is the layout's additive zero, so ``zero_mode``
    is not compiled in) or ``"sm80"`` (gemv_sm80.cuh, the one copy of Ampere/Ada: x is the A
    operand, the zero mode is compiled in; schedule suffix ``_sm80``) or ``"lowbit"`` (gemv.cuh, for
    1-, 2-, 3-bit and 1:2-sparse 7-bit weights: implied by ``bits``, no suffix); ``tokens`` (rows of x
    served: 8, 16 or 32, n8 tiles of mma.sync (1:2-sparse: mma.sp); 1, 2 or 4: the CUDA-core FMA
    variant, not for 1:2-sparse, no padding of x to an n8 tile; 16 for sm80); ``strips`` per warp (16 rows for
    sm90a, 64 columns for sm80); ``warps`` = (warps along N, warps splitting K inside a CTA);
    ``unroll`` (k16 atoms a warp loads before it converts any: its weight bytes in flight are
    unroll x strips x the atom's bytes); ``stage_x`` (``_xs``: each warp copies its step's slice
    of x into shared memory with 16-byte loads and reads its fragments there; otherwise each
    fragment is a 32-bit global load touching one L1 line per token row); ``stages`` (``_p<S>``,
    templates/gemv/gemv_pipe.cuh: each warp streams its weight and x slices through an S-stage
    cp.async ring in shared memory, S - 1 steps in flight while it converts one; x is always staged
    there, so not with ``_xs``; not for the sm80 layout); ``deferred`` (``_ds``, the mma kernels
    of the sm90a and lowbit layouts, with or without a ring, not 1:2-sparse: the mma takes the codes
    in their offset encoding and each group's scale and zero are applied to the fp32 sums once per
    group, templates/atoms/deferred.cuh);
    ``occupancy`` (``_o<N>``: compiled with
    ``__launch_bounds__(threads, N)``, so ptxas caps the registers for N CTAs per SM; 0: its own
    choice). At launch: ``splits``,
    the K slices across CTAs (grid.y; reduced in the kernel in slice order). ``schedule``
    (``m8_s2_w4x2_u8_split4``) is what profiles store (as ``gemv:<schedule>``).
    """

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    tokens: int = 8
    strips: int = 2
    warps: Tuple[int, int] = (4, 2)
    unroll: int = 8
    stage_x: bool = False
    layout: str = "sm90a"
    splits: int = 1
    stages: int = 0
    occupancy: int = 0
    deferred: bool = False

    family = "gemv"

    def __post_init__(self) -> None:
        wn, wk = self.warps
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode, (4, 8) + LOWBIT_BITS) + [
            (self.tokens in TOKENS, f"tokens must be one of {TOKENS} (8/16/32: n8 tiles of mma.sync; 1/2/4: FMA)"),
            (self.layout != "sm80" or not self.fma, "the FMA variant (tokens 1, 2, 4) reads the sm90a or lowbit layout"),
            (self.bits != 7 or not self.fma,
             "1:2-sparse weights run on mma.sp (tokens 8, 16, 32), not the FMA variant (tokens 1, 2, 4)"),
            (self.layout in LAYOUTS, f"layout must be one of {LAYOUTS}"),
            ((self.layout == "lowbit") == (self.bits in LOWBIT_BITS),
             f"{LOWBIT_BITS}-bit weights are read from the lowbit layout, and only they"),
            (self.layout != "lowbit" or self.unroll % block_atoms(self.bits) == 0,
             "unroll: whole blocks of the lowbit layout (4 atoms for 1-3 bits)"),
            (self.layout != "sm80" or self.tokens == 16, "the sm80-layout kernel serves 16 tokens (one m16 tile)"),
            (1 <= self.strips <= 8, "strips must be in [1, 8]"),
            (wn >= 1 and wk >= 1 and 32 * wn * wk <= MAX_THREADS, f"warps: at most {MAX_THREADS} threads"),
            (self.unroll in (1, 2, 4, 8, 16, 32), "unroll must be a power of two <= 32 (the step's weight and x fragments live in registers)"),
            (1 <= self.splits <= MAX_SPLITS, f"splits must be in [1, {MAX_SPLITS}]"),
            (self.stages in STAGES, f"stages must be one of {STAGES}"),
            (0 <= self.occupancy <= 8, "occupancy (CTAs per SM asked of ptxas) must be in [0, 8]"),
            (not self.stages or (self.layout != "sm80" and not self.stage_x),
             "stages (the cp.async ring) read the sm90a or lowbit layout and always stage x (no _xs)"),
            (not self.deferred or (self.layout != "sm80" and not self.fma and self.bits != 7),
             "deferred (_ds: group scaling after the mma) is for the mma kernels of the sm90a and lowbit layouts, "
             "not 1:2-sparse (a dropped element's zero would enter the sums of x)"),
            (self.smem_bytes <= MAX_RING_SMEM,
             f"shared memory {self.smem_bytes} B above the per-CTA opt-in limit {MAX_RING_SMEM} B (a ring, or x "
             f"stages above {MAX_STATIC_SMEM} B, take it dynamically)"),
        ], "GemvConfig")

    def __repr__(self) -> str:
        # stages, occupancy and deferred only when set: the repr heads every generated source (and so
        # its cache key), and the kernels without them keep the sources they had before the fields existed.
        optional = ("stages", "occupancy", "deferred")
        fields = [f for f in dataclasses.fields(self) if f.name not in optional or getattr(self, f.name)]
        return "GemvConfig(" + ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields) + ")"

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1]

    @property
    def strip_rows(self) -> int:
        """Weight rows (outputs) of one strip: a 16-row sm90a atom or a 64-column sm80 atom."""
        return 64 if self.layout == "sm80" else 16

    @property
    def fma(self) -> bool:
        """CUDA-core FMAs instead of mma.sync (templates/gemv/gemv.cuh, kFmaTokens)."""
        return self.tokens < 8

    @property
    def accumulators(self) -> int:
        """fp32 accumulators per lane: 4 per (16-row strip, n8 token tile) or per (n8 column tile);
        FMA: 2 per (strip, token) (rows g and g + 8)."""
        if self.fma:
            return self.strips * self.tokens * 2
        return self.strips * (8 if self.layout == "sm80" else self.tokens // 8) * 4

    @property
    def rows(self) -> int:
        """Weight rows (outputs) per CTA."""
        return self.strip_rows * self.strips * self.warps[0]

    @property
    def step(self) -> int:
        """K atoms (of 16) a CTA consumes per step of its warps."""
        return self.unroll * self.warps[1]

    @property
    def reduce_bytes(self) -> int:
        """The cross-warp K reduction buffer: warps 1.. of each column's accumulators."""
        wn, wk = self.warps
        return (wk - 1) * wn * self.accumulators * 32 * 4

    @property
    def smem_bytes(self) -> int:
        """Shared memory of the kernel: the reduction buffer and, with ``stage_x``, each warp's x
        slice (rows of ``unroll`` x 16 halves padded by 16 bytes), static up to 48 KB and dynamic above
        (:attr:`dynamic_smem`); with ``stages`` the most a launch takes (M = tokens, group 32:
        :meth:`ring_smem_bytes`), dynamic."""
        if self.stages:
            return self.ring_smem_bytes(self.tokens, 32)
        wn, wk = self.warps
        return self.reduce_bytes + (wn * wk * self.tokens * (self.unroll * 32 + 16) if self.stage_x else 0)

    @property
    def dynamic_smem(self) -> bool:
        """Shared memory taken dynamically at launch (opted in above 48 KB): a ring's, and x stages
        above the static limit (``_xs`` with u16-u32 steps: one or two steps per warp for a 4096-long K)."""
        return bool(self.stages) or self.smem_bytes > MAX_STATIC_SMEM

    def ring_smem_bytes(self, m: int, group_size: int) -> int:
        """With ``stages``: the dynamic shared memory of a launch for ``m`` rows of x and a weight
        of ``group_size`` (a power of two >= 32; K for one group) (gemv_pipe.cuh: a warp's stage
        holds its step's weight and the scales and zeros of the groups the step touches; a K-warp
        row's x stage the rows < M of its x slice)."""
        wn, wk = self.warps
        groups = max(1, self.unroll * 16 // group_size)
        warp_stage = self.step_weight_bytes + groups * 2 * self.strips * 16 * 2
        x_stage = min(m, self.tokens) * (self.unroll * 32 + 16)  # one per K-warp row, shared by its warps
        return self.reduce_bytes + self.stages * (wn * wk * warp_stage + wk * x_stage)

    @property
    def step_weight_bytes(self) -> int:
        """Weight bytes a warp reads per step: unroll atoms x strips (the layout's bytes per atom)."""
        if self.layout == "lowbit":
            return self.unroll // block_atoms(self.bits) * self.strips * 128 * lowbit_words(self.bits)
        return self.unroll * self.strips * 128 * (self.bits // 4 if self.layout == "sm90a" else 1)

    @functools.cached_property
    def kernel(self) -> "GemvConfig":
        """The compiled identity: splits at the default; the sm90a layout folds the zero mode (any)."""
        return dataclasses.replace(self, zero_mode="int" if self.layout != "sm80" else self.zero_mode, splits=1)

    @functools.cached_property
    def _tile_schedule(self) -> str:
        wn, wk = self.warps
        return (f"m{self.tokens}_s{self.strips}_w{wn}x{wk}_u{self.unroll}" + ("_xs" if self.stage_x else "")
                + ("_sm80" if self.layout == "sm80" else "") + (f"_p{self.stages}" if self.stages else "")
                + ("_ds" if self.deferred else "")
                + (f"_o{self.occupancy}" if self.occupancy else ""))

    @functools.cached_property
    def kernel_name(self) -> str:
        zero = f"_z{self.zero_mode}" if self.layout == "sm80" else ""  # compiled in there only
        return f"mg_gemv_{self.dtype}_u{self.bits}{zero}_{self._tile_schedule}"

    @functools.cached_property
    def schedule(self) -> str:
        return self._tile_schedule + (f"_split{self.splits}" if self.splits > 1 else "")

    @functools.cached_property
    def name(self) -> str:
        return f"mg_gemv_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4, zero_mode: str = "int") -> "GemvConfig":
        t, s, wn, wk, u, xs, l80, st, ds, oc, sp = schedule_fields(
            _SCHEDULE, schedule, "a gemv",
            "m<1|2|4|8|16|32>_s<strips>_w<N>x<K>_u<unroll>"
            "[_xs][_sm80][_p<stages>][_ds][_o<occupancy>][_split<S>]")
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, tokens=int(t), strips=int(s), warps=(int(wn), int(wk)),
                   unroll=int(u), stage_x=bool(xs), splits=int(sp or 1), stages=int(st or 0), occupancy=int(oc or 0),
                   deferred=bool(ds),
                   layout="sm80" if l80 else ("lowbit" if bits in LOWBIT_BITS else "sm90a"))

    def replace(self, **changes) -> "GemvConfig":
        return dataclasses.replace(self, **changes)

    def steps(self, k: int) -> int:
        """CTA steps (of ``step`` k16 atoms) that cover ``k``: the most splits that each get work."""
        return -(-(-(-k // 16)) // self.step)

    def launch_geometry(self, n: int, k: int) -> Tuple[int, int, int, int]:
        """``(row tiles, splits, chunk, strips)`` for an ``(n, k)`` weight: grid (row tiles, splits);
        each split takes ``chunk`` k16 atoms, a multiple of ``unroll`` so every warp step starts on
        a group boundary's multiple. Splits beyond what K offers are dropped (every split non-empty)."""
        strips = -(-n // self.strip_rows)
        katoms = -(-k // 16)
        row_tiles = -(-strips // (self.strips * self.warps[0]))
        chunk = -(-katoms // self.splits)
        chunk = -(-chunk // self.unroll) * self.unroll
        return row_tiles, -(-katoms // chunk), chunk, strips
