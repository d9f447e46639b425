"""Frozen kernel configurations: the single source of truth.

Name, rendered source, build-cache key and profile key all derive from a config.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Tuple

# dtype name -> (CUTLASS element type in the templates, torch dtype name)
DTYPES = {"f16": ("cutlass::half_t", "float16"), "bf16": ("cutlass::bfloat16_t", "bfloat16")}
# zero mode -> template id (ZeroMode in dequant.cuh)
ZERO_MODES = {"sym": 0, "int": 1, "float": 2, "offset": 3}
SPLIT_K_MODES = {"none": 0, "serial": 1, "parallel": 2, "fused": 3}
# "mixed": the fused mixed-input GEMM kernel; "dequant_mm": the dequantize kernel into a dense
# weight, then torch.mm (cuBLAS), for large M where cuBLAS's Hopper kernels outrun mma.sync.
METHODS = ("mixed", "dequant_mm")
_SCHEDULE = re.compile(r"^t(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)x(\d+)_s(\d+)(?:_k([a-z]+)(\d+))?(?:_sw(\d+))?$")
SWIZZLES = (1, 2, 4, 8)


def _check(rules, what: str) -> None:
    for ok, rule in rules:
        if not ok:
            raise ValueError(f"{what}: {rule}")


@dataclass(frozen=True)
class KernelConfig:
    """One launch configuration of the sm80 mixed-input GEMM template.

    Compiled into the kernel: ``dtype`` (activations and output), ``bits``, ``zero_mode`` (see
    dequant.cuh), ``tile`` = threadblock (BM, BN, BK), ``warps`` = warp grid (M, N, K) inside it
    (K warps are summed through shared memory), ``stages`` (cp.async pipeline depth).
    Chosen at launch: ``split_k_mode`` / ``split_k`` (K slices, blockIdx.z; "serial" takes turns
    on a semaphore, "parallel" adds a reduce kernel, "fused" lets the last slice of each tile sum
    the others) and ``swizzle`` (tile-group size of CUTLASS's identity threadblock swizzle).
    ``method="dequant_mm"`` instead dequantizes the weight and calls torch.mm; the tile fields
    then keep their defaults and mean nothing.

    ``schedule`` is the name without the weight kind (``t16x64x128_w1x1x4_s4_kfused4``, or
    ``dequant_mm``): what profiles store and ``MIXED_GEMM_SCHEDULE`` overrides.
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
    method: str = "mixed"

    def __post_init__(self) -> None:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        _check([
            (self.dtype in DTYPES, f"dtype must be one of {tuple(DTYPES)}"),
            (self.bits in (4, 8), "bits must be 4 or 8"),
            (self.zero_mode in ZERO_MODES, f"zero_mode must be one of {tuple(ZERO_MODES)}"),
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
            (self.method in METHODS, f"method must be one of {METHODS}"),
            (self.method == "mixed" or self._schedule_fields_default(),
             "method dequant_mm takes no tile, warps, stages, split-K or swizzle"),
        ], f"KernelConfig {self.tile}/{self.warps}")

    def _schedule_fields_default(self) -> bool:
        base = KernelConfig.__dataclass_fields__
        return all(getattr(self, f) == base[f].default for f in
                   ("tile", "warps", "stages", "split_k_mode", "split_k", "swizzle"))

    def __hash__(self) -> int:
        # Configs key the module and launch-plan caches on every matmul call: hash the fields once.
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash(dataclasses.astuple(self))

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
        stage = bm * bk * 2 + bk * bn * self.bits // 8 + s_bytes + (0 if self.zero_mode == "sym" else s_bytes)
        acc_per_thread = (bm // wm // 16) * (bn // wn // 8) * 4
        reduce = (wk - 1) * wm * wn * 32 * acc_per_thread * 4
        return max(self.stages * stage, reduce)

    @functools.cached_property
    def kernel(self):
        """The compiled identity: this config with the launch-time fields at their defaults
        (for ``dequant_mm``, the :class:`DequantConfig` of the weight kind)."""
        if self.method == "dequant_mm":
            return DequantConfig(dtype=self.dtype, bits=self.bits, zero_mode=self.zero_mode)
        return dataclasses.replace(self, split_k_mode="none", split_k=1, swizzle=1)

    @functools.cached_property
    def kernel_name(self) -> str:
        """The kernel's symbol and cache name (compiled fields only)."""
        if self.method == "dequant_mm":
            return self.kernel.kernel_name
        return f"mg_sm80_{self.dtype}_u{self.bits}_z{self.zero_mode}_{self._tile_schedule}"

    @functools.cached_property
    def _tile_schedule(self) -> str:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        return f"t{bm}x{bn}x{bk}_w{wm}x{wn}x{wk}_s{self.stages}"

    @functools.cached_property
    def schedule(self) -> str:
        """Everything but the weight kind (dtype, bits, zero mode): what a profile entry stores."""
        if self.method == "dequant_mm":
            return "dequant_mm"
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
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4, zero_mode: str = "int") -> "KernelConfig":
        """The config of ``schedule`` (see :attr:`schedule`) for one weight kind."""
        if schedule == "dequant_mm":
            return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, method="dequant_mm")
        m = _SCHEDULE.match(schedule)
        if m is None:
            raise ValueError(f"schedule: {schedule!r} is not 'dequant_mm' nor of the form "
                             "t<BM>x<BN>x<BK>_w<M>x<N>x<K>_s<stages>[_k<serial|parallel|fused><splits>][_sw<1|2|4|8>]")
        v = m.groups()
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, tile=tuple(map(int, v[0:3])),
                   warps=tuple(map(int, v[3:6])), stages=int(v[6]), split_k_mode=v[7] or "none",
                   split_k=int(v[8] or 1), swizzle=int(v[9] or 1))

    def grid(self, m: int, n_pad: int) -> Tuple[int, int, int]:
        """Launch grid of CUTLASS's GemmIdentityThreadblockSwizzle: (tiles_m * t, ceil(tiles_n / t), splits)."""
        bm, bn, _ = self.tile
        t = self.swizzle
        tiles_m, tiles_n = (m + bm - 1) // bm, (n_pad + bn - 1) // bn
        return (tiles_m * t, (tiles_n + t - 1) // t, self.split_k)

    def replace(self, **changes) -> "KernelConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DequantConfig:
    """The standalone dequantize kernel for one weight kind (dequant_kernel.cuh)."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"

    THREADS = 256
    TILE_K = 128

    def __post_init__(self) -> None:
        _check([
            (self.dtype in DTYPES, f"dtype must be one of {tuple(DTYPES)}"),
            (self.bits in (4, 8), "bits must be 4 or 8"),
            (self.zero_mode in ZERO_MODES, f"zero_mode must be one of {tuple(ZERO_MODES)}"),
        ], "DequantConfig")

    @property
    def threads(self) -> int:
        return self.THREADS

    @property
    def smem_bytes(self) -> int:
        return 64 * (self.TILE_K + 8) * 2

    @property
    def kernel_name(self) -> str:
        return f"mg_dequant_{self.dtype}_u{self.bits}_z{self.zero_mode}"

    name = kernel_name

    def grid(self, n_pad: int, k16: int) -> Tuple[int, int, int]:
        return (n_pad // 64, (k16 * 16 + self.TILE_K - 1) // self.TILE_K, 1)
