"""Register budgets of the decode kernels the shipped profile leans on (nvcc, no GPU): each keeps
the CTAs per SM it was profiled at, without spilling more than it did. A template change that moves
one of them makes its profile entries wrong, silently. Two did: the residual epilogue took the bf16
8-K-warp u16 `_ds` kernel from 128 to 154 registers (one CTA per SM, 4096x4096 6.74 -> 8.25 µs), and
the staged-x ldmatrix read cost `_xs_o4` 280 bytes of spills and the int8 `_xs_ds` a CTA per SM
(docs/notes/gemv.md). `bench/register_audit.py` compares every kernel a profile names with another
commit; these are the few kept here as budgets. The figures are nvcc 13.0's (sm_90a)."""
from pathlib import Path

import pytest

from mixed_gemm.compile import ptxas_usage
from mixed_gemm.kernels.gemv import GemvConfig

pytestmark = pytest.mark.nvcc  # skipped without nvcc (tests/conftest.py)

REGISTERS_PER_SM = 65536
GENERATED = Path(__file__).resolve().parents[2] / "generated"  # rendered from the catalog, kept in sync

# (dtype, bits, schedule, CTAs per SM it runs at, spill bytes it may have), with the entries it serves.
BUDGETS = [
    ("f16", 4, "m8_s1_w1x8_u16_ds", 2, 8),      # 4096x4096 at M=1
    ("f16", 4, "m8_s2_w8x1_u8_ds", 2, 12),      # 70B gate|up and qkv at M=1
    ("bf16", 4, "m8_s2_w8x1_u8_ds", 2, 24),
    ("f16", 4, "m8_s2_w4x2_u8_ds", 2, 0),       # 8B gate|up and down at M=1
    ("f16", 4, "m8_s1_w1x8_u16_xs_o4", 4, 0),   # 6144x4096 at M 2-8
    ("bf16", 4, "m8_s1_w1x8_u16_xs_o4", 4, 0),
    ("f16", 8, "m8_s1_w1x8_u8_xs_ds", 3, 0),    # int8 4096x4096 and 6144x4096 at M 1-8
    ("bf16", 8, "m8_s1_w1x8_u8_xs_ds", 3, 0),
]


def register_cap(threads: int, ctas: int) -> int:
    """The most registers a thread may use for ``ctas`` CTAs of ``threads`` per SM (a warp's
    allocation is rounded up to 8 registers a thread)."""
    return REGISTERS_PER_SM // (threads * ctas) // 8 * 8


def test_register_cap():
    assert register_cap(256, 2) == 128 and register_cap(256, 3) == 80 and register_cap(256, 4) == 64


@pytest.mark.parametrize("dtype,bits,schedule,ctas,spills", BUDGETS, ids=[f"{d}-u{b}-{s}" for d, b, s, *_ in BUDGETS])
def test_decode_kernel_keeps_its_occupancy(dtype, bits, schedule, ctas, spills):
    config = GemvConfig.from_schedule(schedule, dtype=dtype, bits=bits)
    regs, spilled = ptxas_usage(GENERATED / f"{config.kernel_name}.cu")
    cap = register_cap(config.threads, ctas)
    assert regs <= cap, (f"{config.kernel_name}: {regs} registers, over the {cap} that {ctas} CTAs of "
                         f"{config.threads} threads per SM allow; re-profile its entries or restore it")
    assert spilled <= spills, f"{config.kernel_name}: {spilled} bytes spilled (budget {spills})"
