"""``Sm80Config``: the frozen configuration of the sm80 family, its single source of truth.

Name, rendered source, build-cache key and profile key all derive from a config.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

from ..common import SPLIT_K_MODES, check_weight_kind, hash_once, raise_on, schedule_fields
from ..gemv import lowbit_layout

_SCHEDULE = re.compile(r"^t(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)x(\d+)_s(\d+)(?:_(sm90a|lowbit))?(?:_k([a-z]+)(\d+))?(?:_sw(\d+))?$")
LAYOUTS = ("sm80", "sm90a", "lowbit")
# The widths each layout holds that these tiles read (the lowbit layout: 1-3 bits; its 1:2-sparse
# 7 bits are mma.sp's compressed A fragments, which the weight-as-B tiles cannot take: the gemv
# family serves them up to 32 tokens, dequantize + cuBLAS above).
LAYOUT_BITS = {"sm80": (4, 8), "sm90a": (4, 8), "lowbit": lowbit_layout.BLOCK_BITS}
SWIZZLES = (1, 2, 4, 8)


@hash_once
@dataclass(frozen=True)
class Sm80Config:
    """One launch configuration of the sm80 mixed-input GEMM template.

    Compiled into the kernel: ``dtype`` (activations and output), ``bits``, ``zero_mode`` (see
    dequant.cuh), ``tile`` = threadblock (BM, BN, BK), ``warps`` = warp grid (M, N, K) inside it
    (K warps are summed through shared memory), ``stages`` (cp.async pipeline depth), ``layout``:
    the weight layout read, ``"sm80"``, ``"sm90a"`` (the Hopper one copy, schedule suffix
    ``_sm90a``) or ``"lowbit"`` (1-3 bits, suffix ``_lowbit``); the atom
    layouts' zero is additive and always stored, so the zero mode is not compiled in there.
    Chosen at launch: ``split_k_mode`` / ``split_k`` (K slices, blockIdx.z; "serial" takes turns
    on a semaphore, "parallel" adds a reduce kernel, "fused" lets the last slice of each tile sum
    the others) and ``swizzle`` (tile-group size of CUTLASS's identity threadblock swizzle).

    ``schedule`` is the name without the weight kind (``t16x64x128_w1x1x4_s4_kfused4``): what
    profiles store (as ``sm80:<schedule>``) and ``MIXED_GEMM_SCHEDULE`` overrides.
    """

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    tile: Tuple[int, int, int] = (128, 128, 64)
    warps: Tuple[int, int, int] = (2, 2, 1)
    stages: int = 4
    split_k_mode: str = "none"
    split_k: int = 1
    swizzle: int = 1
    instruction: Tuple[int, int, int] = (16, 8, 16)
    layout: str = "sm80"

    family = "sm80"

    def __post_init__(self) -> None:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        raise_on([(self.layout in LAYOUTS, f"layout must be one of {LAYOUTS}")] +
                 check_weight_kind(self.dtype, self.bits, self.zero_mode, LAYOUT_BITS.get(self.layout, ())) + [
            (self.instruction == (16, 8, 16), "instruction must be (16, 8, 16): mma.sync.m16n8k16"),
            (bk in (64, 128), "tile BK must be 64 or 128"),
            (bm % (16 * wm) == 0, "tile BM must be a multiple of 16 * warps M"),
            (bn % (64 * wn) == 0, "tile BN must be a multiple of 64 * warps N (the B atom is 64 wide)"),
            ((bk // 16) % wk == 0, "BK / 16 must be a multiple of warps K"),
            (self.stages >= 2, "stages must be >= 2"),
            (self.threads <= 1024, "at most 1024 threads per block"),
            (self.split_k_mode in SPLIT_K_MODES, f"split_k_mode must be one of {tuple(SPLIT_K_MODES)}"),
            (1 <= self.split_k <= 64, "split_k must be in [1, 64]"),
            (self.split_k == 1 or self.split_k_mode != "none", "split_k > 1 needs split_k_mode serial or parallel"),
            (self.swizzle in SWIZZLES, f"swizzle must be one of {SWIZZLES}"),
        ], f"Sm80Config {self.tile}/{self.warps}")

    # ---- derived quantities (kept in step with gemm_sm80.cuh; the rendered source asserts them) ----
    # Cached per instance (the config is frozen): matmul reads them on every call.
    @functools.cached_property
    def threads(self) -> int:
        wm, wn, wk = self.warps
        return 32 * wm * wn * wk

    @functools.cached_property
    def smem_bytes(self) -> int:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        s_bytes = (bk // 32) * bn * 2  # group sizes >= 32: at most BK/32 groups per k-tile
        zeros = self.kernel.zero_mode != "sym"  # the atom layouts always store their additive zero
        # Every layout these tiles read stores `bits` bits per weight (the lowbit layout's 1-3-bit
        # blocks: `bits` words per lane per 4 atoms, kRowBytes in gemm_sm80.cuh).
        stored = self.bits
        stage = bm * bk * 2 + bk * bn * stored // 8 + s_bytes + (s_bytes if zeros else 0)
        acc_per_thread = (bm // wm // 16) * (bn // wn // 8) * 4
        reduce = (wk - 1) * wm * wn * 32 * acc_per_thread * 4
        return max(self.stages * stage, reduce)

    @functools.cached_property
    def kernel(self) -> "Sm80Config":
        """The compiled identity: this config with the launch-time fields at their defaults (and,
        on the atom layouts, whose zero is always additive, one zero mode for all)."""
        zero = self.zero_mode if self.layout == "sm80" else "int"
        return dataclasses.replace(self, split_k_mode="none", split_k=1, swizzle=1, zero_mode=zero)

    @functools.cached_property
    def kernel_name(self) -> str:
        """The kernel's symbol and cache name (compiled fields only)."""
        zero = f"_z{self.zero_mode}" if self.layout == "sm80" else ""  # compiled in there only
        return f"mg_sm80_{self.dtype}_u{self.bits}{zero}_{self._tile_schedule}"

    @functools.cached_property
    def _tile_schedule(self) -> str:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        return f"t{bm}x{bn}x{bk}_w{wm}x{wn}x{wk}_s{self.stages}" + ("" if self.layout == "sm80" else f"_{self.layout}")

    @functools.cached_property
    def schedule(self) -> str:
        """Everything but the weight kind (dtype, bits, zero mode): what a profile entry stores."""
        sched = self._tile_schedule
        if self.split_k_mode != "none":
            sched += f"_k{self.split_k_mode}{self.split_k}"
        if self.swizzle != 1:
            sched += f"_sw{self.swizzle}"
        return sched

    @functools.cached_property
    def name(self) -> str:
        """Every field: weight kind and schedule."""
        return f"mg_sm80_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self.schedule}"

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4, zero_mode: str = "int") -> "Sm80Config":
        """The config of ``schedule`` (see :attr:`schedule`) for one weight kind."""
        v = schedule_fields(
            _SCHEDULE, schedule, "an sm80",
            "t<BM>x<BN>x<BK>_w<M>x<N>x<K>_s<stages>[_sm90a|_lowbit][_k<serial|parallel|fused><splits>][_sw<1|2|4|8>]")
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, tile=tuple(map(int, v[0:3])),
                   warps=tuple(map(int, v[3:6])), stages=int(v[6]), layout=v[7] or "sm80",
                   split_k_mode=v[8] or "none", split_k=int(v[9] or 1), swizzle=int(v[10] or 1))

    def grid(self, m: int, n_pad: int) -> Tuple[int, int, int]:
        """Launch grid of CUTLASS's GemmIdentityThreadblockSwizzle: (tiles_m * t, ceil(tiles_n / t), splits)."""
        bm, bn, _ = self.tile
        t = self.swizzle
        tiles_m, tiles_n = (m + bm - 1) // bm, (n_pad + bn - 1) // bn
        return (tiles_m * t, (tiles_n + t - 1) // t, self.split_k)

    def replace(self, **changes) -> "Sm80Config":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
