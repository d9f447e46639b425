"""Register budgets of the kernels the shipped profile leans on (nvcc, no GPU): each keeps the CTAs
per SM it was profiled at, without spilling more than it did. A template change that moves one of
them makes its profile entries wrong, silently. Two did: the residual epilogue took the bf16
8-K-warp u16 `_ds` gemv from 128 to 154 registers (one CTA per SM, 4096x4096 6.74 -> 8.25 µs), and
the staged-x ldmatrix read cost `_xs_o4` 280 bytes of spills and the int8 `_xs_ds` a CTA per SM
(docs/notes/gemv.md). `bench/register_audit.py` compares every kernel a profile names with another
commit; these are the few kept here as budgets. The figures are nvcc 13.0's (sm_90a).
"""
from pathlib import Path

import pytest

from mixed_gemm.compile import ptxas_usage
from mixed_gemm.kernels import parse_schedule

pytestmark = pytest.mark.nvcc  # skipped without nvcc (tests/conftest.py)

REGISTERS_PER_SM = 65536
GENERATED = Path(__file__).resolve().parents[2] / "generated"  # rendered from the catalog, kept in sync

# (family:schedule, dtype, bits, CTAs per SM it runs at, spill bytes it may have), with what it serves.
BUDGETS = [
    ("gemv:m8_s1_w1x8_u16_ds", "f16", 4, 2, 8),       # 4096x4096 at M=1
    ("gemv:m8_s2_w8x1_u8_ds", "f16", 4, 2, 12),       # 70B gate|up and qkv at M=1
    ("gemv:m8_s2_w8x1_u8_ds", "bf16", 4, 2, 24),
    ("gemv:m8_s2_w4x2_u8_ds", "f16", 4, 2, 0),        # 8B gate|up and down at M=1
    ("gemv:m8_s1_w1x8_u16_xs_o4", "f16", 4, 4, 0),    # 6144x4096 at M 2-8
    ("gemv:m8_s1_w1x8_u16_xs_o4", "bf16", 4, 4, 0),
    ("gemv:m8_s1_w1x8_u8_xs_ds", "f16", 8, 3, 0),     # int8 4096x4096 and 6144x4096 at M 1-8
    ("gemv:m8_s1_w1x8_u8_xs_ds", "bf16", 8, 3, 0),
    ("sm90s:t128x16x128_c1x1_o2_s0_auto", "f16", 4, 2, 0),  # M = 16 and 32 on most shapes
    ("sm90s:t128x32x128_c1x1_o2_s0_auto", "f16", 4, 2, 0),
    ("sm90s:t256x64x128_c1x1_o1_s0_auto", "f16", 4, 1, 0),  # M = 64 on the large shapes
    ("moe_gemv:w13_s1_w4x2_u8_ds", "f16", 4, 2, 0),    # Mixtral's one-token layer
    ("moe_gemv:w2_s2_w4x2_u8_ds", "f16", 4, 2, 44),
    ("moe_gemv:w13_s1_w2x4_u8_ds", "f16", 4, 2, 0),    # the small experts' one-token gate|up
    ("moe_sm90s:w13_t256x16x128_s0_p", "f16", 4, 1, 20),  # 8-16 tokens, persistent
]


def register_cap(threads: int, ctas: int) -> int:
    """The most registers a thread may use for ``ctas`` CTAs of ``threads`` per SM (a warp's
    allocation is rounded up to 8 registers a thread)."""
    return REGISTERS_PER_SM // (threads * ctas) // 8 * 8


def test_register_cap():
    assert register_cap(256, 2) == 128 and register_cap(256, 3) == 80 and register_cap(256, 4) == 64


@pytest.mark.parametrize("schedule,dtype,bits,ctas,spills", BUDGETS,
                         ids=[f"{s.replace(':', '-')}-{d}-u{b}" for s, d, b, *_ in BUDGETS])
def test_kernel_keeps_its_occupancy(schedule, dtype, bits, ctas, spills):
    config = parse_schedule(schedule, dtype=dtype, bits=bits, zero_mode="int")
    regs, spilled = ptxas_usage(GENERATED / f"{config.kernel_name}.cu")
    cap = register_cap(config.threads, ctas)
    assert regs <= cap, (f"{config.kernel_name}: {regs} registers, over the {cap} that {ctas} CTAs of "
                         f"{config.threads} threads per SM allow; re-profile its entries or restore it")
    assert spilled <= spills, f"{config.kernel_name}: {spilled} bytes spilled (budget {spills})"
