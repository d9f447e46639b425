"""``DequantMMConfig``: dequantize the weight with the dequantize kernel, then cuBLAS (torch.mm).

The family has one schedule, ``dequant_mm``; its compiled identity is the dequantize kernel of the
weight kind (``mg_dequant_<dtype>_u<bits>_z<zero mode>``, also what :func:`mixed_gemm.dequantize`
runs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..common import ATOM_K, ATOM_N, check_weight_kind, raise_on

SCHEDULE = "dequant_mm"


@dataclass(frozen=True)
class DequantMMConfig:
    """The dequantize kernel for one weight kind (dequant_mm/dequant_kernel.cuh)."""

    dtype: str = "f16"
    bits: int = 4
    zero_mode: str = "int"

    family = "dequant_mm"
    THREADS = 256     # 8 warps, one atom of a 64 x 128 tile each
    TILE_K = 128

    def __post_init__(self) -> None:
        raise_on(check_weight_kind(self.dtype, self.bits, self.zero_mode), "DequantMMConfig")

    @property
    def threads(self) -> int:
        return self.THREADS

    @property
    def smem_bytes(self) -> int:
        return ATOM_N * (self.TILE_K + 8) * 2

    @property
    def kernel(self) -> "DequantMMConfig":
        return self

    @property
    def kernel_name(self) -> str:
        return f"mg_dequant_{self.dtype}_u{self.bits}_z{self.zero_mode}"

    name = kernel_name
    schedule = SCHEDULE

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", bits: int = 4,
                      zero_mode: str = "int") -> "DequantMMConfig":
        if schedule != SCHEDULE:
            raise ValueError(f"schedule: the dequant_mm family has one schedule, {SCHEDULE!r}; got {schedule!r}")
        return cls(dtype=dtype, bits=bits, zero_mode=zero_mode)

    def grid(self, n_pad: int, k16: int) -> Tuple[int, int, int]:
        """One block per 64 columns x TILE_K rows of K."""
        return (n_pad // ATOM_N, (k16 * ATOM_K + self.TILE_K - 1) // self.TILE_K, 1)
