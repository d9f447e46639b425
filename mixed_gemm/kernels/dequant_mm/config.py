"""``DequantMMConfig``: dequantize the weight with the dequantize kernel, then cuBLAS (torch.mm).

The family has one schedule per weight layout it reads: ``dequant_mm`` (the sm80 layout; compiled
identity ``mg_dequant_<dtype>_u<bits>_z<zero mode>``) and ``dequant_mm_sm90a`` (the sm90a layout,
whose additive zero serves every zero mode: ``mg_dequant_<dtype>_u<bits>_sm90a``). The kernel is
also what :func:`mixed_gemm.dequantize` runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Tuple

from ..common import ATOM_K, ATOM_N, check_weight_kind, raise_on
from ..gemv.lowbit_layout import BITS as LOWBIT_BITS, block_atoms

SCHEDULE = "dequant_mm"
SCHEDULES = {"sm80": SCHEDULE, "sm90a": SCHEDULE + "_sm90a", "lowbit": SCHEDULE + "_lowbit"}  # layout -> schedule


@dataclass(frozen=True)
class DequantMMConfig:
    """The dequantize kernel for one weight kind and layout (dequant_mm/dequant_kernel.cuh for
    ``"sm80"``, dequant_mm/dequant_sm90a.cuh for ``"sm90a"``)."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"
    layout: str = "sm80"

    family = "dequant_mm"
    THREADS = 256     # 8 warps, one atom of a 64 x 128 tile each
    TILE_K = 128

    def __post_init__(self) -> None:
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode, (4, 8) + LOWBIT_BITS)
                 + [(self.layout in SCHEDULES, f"layout must be one of {tuple(SCHEDULES)}"),
                    ((self.layout == "lowbit") == (self.bits in LOWBIT_BITS),
                     f"{LOWBIT_BITS}-bit weights are in the lowbit layout, and only they")], "DequantMMConfig")

    @property
    def threads(self) -> int:
        return self.THREADS

    @property
    def smem_bytes(self) -> int:
        return ATOM_N * (self.TILE_K + 8) * 2 if self.layout == "sm80" else 0

    @property
    def kernel(self) -> "DequantMMConfig":
        # sm90a, lowbit: every zero mode is the layout's additive zero, one binary for all four.
        return self if self.layout == "sm80" else dataclasses.replace(self, zero_mode="int")

    @property
    def kernel_name(self) -> str:
        if self.layout != "sm80":
            return f"mg_dequant_{self.dtype}_u{self.bits}_{self.layout}"
        return f"mg_dequant_{self.dtype}_u{self.bits}_z{self.zero_mode}"

    @property
    def name(self) -> str:
        return self.kernel_name if self.layout == "sm80" else f"{self.kernel_name}_z{self.zero_mode}"

    @property
    def schedule(self) -> str:
        return SCHEDULES[self.layout]

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "DequantMMConfig":
        layouts = {v: k for k, v in SCHEDULES.items()}
        if schedule not in layouts:
            raise ValueError(f"schedule: the dequant_mm family's schedules are {tuple(layouts)}; got {schedule!r}")
        layout = layouts[schedule]
        if bits in LOWBIT_BITS and layout == "sm80":  # "dequant_mm" names the kernel of the weight's layout
            layout = "lowbit"
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode, layout=layout)

    def grid(self, n_pad: int, k16: int) -> Tuple[int, int, int]:
        """sm80: one block per 64 columns x TILE_K rows of K; sm90a / lowbit: one per 8 layout
        blocks of a block column (a block: one atom; four for 1-3 bits in the lowbit layout)."""
        if self.layout == "sm90a":
            return (-(-n_pad // 128), k16, 1)
        if self.layout == "lowbit":
            return (-(-n_pad // 128), k16 // block_atoms(self.bits), 1)
        return (n_pad // ATOM_N, (k16 * ATOM_K + self.TILE_K - 1) // self.TILE_K, 1)
