"""The frozen kernel configuration: the single source of truth.

Name, rendered source, build-cache key and profile key all derive from a ``KernelConfig``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Tuple

DTYPES = ("f16",)
ZERO_MODES = {"sym": 0, "int": 1}  # value = template id in gemm_sm80.cuh's ZeroMode


@dataclass(frozen=True)
class KernelConfig:
    """One instantiation of the sm80 mixed-input GEMM template.

    ``tile`` is the threadblock shape (BM, BN, BK); ``warps`` the warp grid (M, N, K) inside it:
    each warp computes a (BM/WM) x (BN/WN) tile over BK/WK of every k-tile, and K warps are summed
    through shared memory at the end. ``stages`` is the depth of the cp.async pipeline.
    """

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    tile: Tuple[int, int, int] = (128, 128, 64)
    warps: Tuple[int, int, int] = (2, 2, 1)
    stages: int = 4
    instruction: Tuple[int, int, int] = (16, 8, 16)

    def __post_init__(self) -> None:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        rules = [
            (self.dtype in DTYPES, f"dtype must be one of {DTYPES}"),
            (self.bits in (4, 8), "bits must be 4 or 8"),
            (self.zero_mode in ZERO_MODES, f"zero_mode must be one of {tuple(ZERO_MODES)}"),
            (self.instruction == (16, 8, 16), "instruction must be (16, 8, 16): mma.sync.m16n8k16"),
            (bk in (64, 128), "tile BK must be 64 or 128"),
            (bm % (16 * wm) == 0, "tile BM must be a multiple of 16 * warps M"),
            (bn % (64 * wn) == 0, "tile BN must be a multiple of 64 * warps N (the B atom is 64 wide)"),
            ((bk // 16) % wk == 0, "BK / 16 must be a multiple of warps K"),
            (self.stages >= 2, "stages must be >= 2"),
            (self.threads <= 1024, "at most 1024 threads per block"),
        ]
        for ok, rule in rules:
            if not ok:
                raise ValueError(f"KernelConfig {self.tile}/{self.warps}: {rule}")

    # ---- derived quantities (kept in step with gemm_sm80.cuh; the rendered source asserts them) ----
    @property
    def threads(self) -> int:
        wm, wn, wk = self.warps
        return 32 * wm * wn * wk

    @property
    def smem_bytes(self) -> int:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        group_rows = bk // 32
        s_bytes = group_rows * bn * 2
        stage = bm * bk * 2 + bk * bn * self.bits // 8 + s_bytes + (0 if self.zero_mode == "sym" else s_bytes)
        mainloop = self.stages * stage
        acc_per_thread = (bm // wm // 16) * (bn // wn // 8) * 4
        reduce = (wk - 1) * wm * wn * 32 * acc_per_thread * 4
        return max(mainloop, reduce)

    @property
    def name(self) -> str:
        bm, bn, bk = self.tile
        wm, wn, wk = self.warps
        return (
            f"mg_sm80_{self.dtype}_u{self.bits}_z{self.zero_mode}"
            f"_t{bm}x{bn}x{bk}_w{wm}x{wn}x{wk}_s{self.stages}"
        )

    def grid(self, m: int, n_pad: int) -> Tuple[int, int, int]:
        bm, bn, _ = self.tile
        return ((n_pad + bn - 1) // bn, (m + bm - 1) // bm, 1)

    def replace(self, **changes) -> "KernelConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
