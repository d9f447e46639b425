"""Python mirrors of ``templates/common/constants.cuh``, and the weight-kind vocabulary every family
shares. One definition each; :func:`constant_checks` feeds the ``static_assert`` lines every
rendered source carries, so the two sides cannot drift apart silently."""
from __future__ import annotations

from typing import List, Tuple

# dtype name -> (CUTLASS element type in the templates, torch dtype name)
DTYPES = {"f16": ("cutlass::half_t", "float16"), "bf16": ("cutlass::bfloat16_t", "bfloat16")}
# zero mode -> mixed_gemm::ZeroMode
ZERO_MODES = {"sym": 0, "int": 1, "float": 2, "offset": 3}
# split-K mode -> mixed_gemm::SplitKMode
SPLIT_K_MODES = {"none": 0, "serial": 1, "parallel": 2, "fused": 3}
PER_CHANNEL_SHIFT = 30     # mixed_gemm::kPerChannelShift: group_shift of a per-channel weight
ATOM_K, ATOM_N = 16, 64    # mixed_gemm::kAtomK / kAtomN: the sm80 layout's atom
REDUCE_THREADS = 256       # mixed_gemm::kReduceThreads


def round_up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m`` (the layouts' padding)."""
    return (x + m - 1) // m * m


def _cxx_enum(name: str, mapping: dict, members: dict) -> List[Tuple[str, int]]:
    return [(f"int(mixed_gemm::{name}::{members[key]})", value) for key, value in mapping.items()]


def constant_checks() -> List[Tuple[str, int]]:
    """``(C++ expression, Python value)`` pairs that must be equal."""
    return (
        _cxx_enum("ZeroMode", ZERO_MODES, {"sym": "kSymmetric", "int": "kInteger", "float": "kFloat",
                                           "offset": "kOffset"})
        + _cxx_enum("SplitKMode", SPLIT_K_MODES, {"none": "kNone", "serial": "kSerial", "parallel": "kParallel",
                                                  "fused": "kFused"})
        + [("mixed_gemm::kPerChannelShift", PER_CHANNEL_SHIFT), ("mixed_gemm::kAtomK", ATOM_K),
           ("mixed_gemm::kAtomN", ATOM_N), ("mixed_gemm::kReduceThreads", REDUCE_THREADS)]
    )


def check_weight_kind(dtype: str, bits: int, zero_mode: str, bits_allowed=(4, 8)) -> List[Tuple[bool, str]]:
    """The rules every family's config applies to its weight kind (``bits_allowed``: its widths)."""
    return [
        (dtype in DTYPES, f"dtype must be one of {tuple(DTYPES)}"),
        (bits in bits_allowed, f"bits must be one of {tuple(bits_allowed)}"),
        (zero_mode in ZERO_MODES, f"zero_mode must be one of {tuple(ZERO_MODES)}"),
    ]


def raise_on(rules, what: str) -> None:
    for ok, rule in rules:
        if not ok:
            raise ValueError(f"{what}: {rule}")
