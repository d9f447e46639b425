"""Python mirrors of ``templates/common/constants.cuh``, and the weight-kind vocabulary every family
shares. One definition each; :func:`constant_checks` feeds the ``static_assert`` lines every
rendered source carries, so the two sides cannot drift apart silently."""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

# dtype name -> (CUTLASS element type in the templates, torch dtype name)
DTYPES = {"f16": ("cutlass::half_t", "float16"), "bf16": ("cutlass::bfloat16_t", "bfloat16")}
# Element names of the non-GEMM kernels (allreduce, router) -> (C++ type in CUDA's headers, bytes),
# and torch dtype name -> element name.
CUDA_ELEMENTS = {"f16": ("__half", 2), "bf16": ("__nv_bfloat16", 2), "f32": ("float", 4)}
ELEMENT_NAMES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
# zero mode -> mixed_gemm::ZeroMode
ZERO_MODES = {"sym": 0, "int": 1, "float": 2, "offset": 3}
# split-K mode -> mixed_gemm::SplitKMode
SPLIT_K_MODES = {"none": 0, "serial": 1, "parallel": 2, "fused": 3}
PER_CHANNEL_SHIFT = 30     # mixed_gemm::kPerChannelShift: group_shift of a per-channel weight
ATOM_K, ATOM_N = 16, 64    # mixed_gemm::kAtomK / kAtomN: the sm80 layout's atom
REDUCE_THREADS = 256       # mixed_gemm::kReduceThreads
# mixed_gemm::kGateUpBlock (templates/common/gate_up.cuh; checked by the grouped families' sources,
# grouped_constant_checks, so that the dense kernels do not depend on it): a stacked gate|up weight
# holds gate rows 8j..8j+7, then up rows 8j..8j+7, for each j.
GATE_UP_BLOCK = 8


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


def hash_once(cls):
    """Class decorator, above ``@dataclass(frozen=True)``: the config's hash computed once per instance
    (configs key the module and launch-plan caches on every matmul call) and kept in its ``__dict__``
    beside the fields (a frozen dataclass's own ``__setattr__`` refuses it; equality still compares
    the fields alone)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash_once")
        if h is None:
            h = hash(dataclasses.astuple(self))
            object.__setattr__(self, "_hash_once", h)
        return h

    cls.__hash__ = __hash__
    return cls


def raise_on(rules, what: str) -> None:
    for ok, rule in rules:
        if not ok:
            raise ValueError(f"{what}: {rule}")


def schedule_fields(pattern: "re.Pattern", schedule: str, what: str, grammar: str) -> tuple:
    """The fields of ``schedule`` in a family's grammar (``pattern``'s groups), or a ValueError that
    names the grammar; ``what`` is the family with its article ("a gemv", "an sm80")."""
    m = pattern.match(schedule)
    if m is None:
        raise ValueError(f"schedule: {schedule!r} is not {what} schedule {grammar}")
    return m.groups()


def one_spelling(config, schedule: str, what: str):
    """``config`` where ``schedule`` is its one spelling (defaults left out), else a ValueError."""
    if config.schedule != schedule:
        raise ValueError(f"schedule: {schedule!r} is not {what} schedule's spelling; it is {config.schedule!r}")
    return config


# ---- re-fitting a split factor measured on another shape (selection borrows profile entries) ----
FILL = 0.9  # a grid of fewer CTAs than this share of the SMs leaves bandwidth unused at decode


def split_for_waves(s0: int, tiles: int, k_tiles: int, sms: int) -> int:
    """For tiles that fill an SM alone (whole waves): when ``s0`` spills past one wave on this
    shape, the factor within one of it that minimizes waves per slice, ``ceil(tiles * s / sms) / s``
    (a slice's work falls like 1/s while a started wave costs whole); ties to ``s0``, then the
    smaller. 4 slices of 40 tiles make 160 CTAs, 2 waves on 132 SMs, where 3 make 1; 2 slices of 80
    make 2 waves, the second a fifth full, where 3 make 2 full ones (held-out shapes,
    docs/notes/selection.md). Within one wave ``s0`` stays: the metric would keep adding slices."""
    waves = lambda s: -(-tiles * s // sms)  # noqa: E731
    if waves(s0) <= 1:
        return s0
    options = [s for s in (s0 - 1, s0 + 1) if 2 <= s <= k_tiles] + [s0]
    return min(options, key=lambda s: (waves(s) / s, s != s0, s))


def split_for_fill(s0: int, columns_measured: int, columns: int, max_splits: int, sms: int,
                   keep_count_on_more: bool = False) -> int:
    """For memory-streaming decode CTAs (several share an SM): ``s0`` split a grid of
    ``columns_measured`` CTA columns best. A shape with fewer columns keeps the measured CTA count
    (``s0 * columns_measured / columns`` slices) where ``s0`` would leave the GPU under-filled
    (fewer than FILL x sms CTAs): 28672 rows unsplit in 224 CTAs, 13824 rows make 108, and 2 slices
    ran 1.34x faster. With ``keep_count_on_more`` a shape with more columns keeps it too, rather
    than add CTAs: gemv, 4096 rows in 8 slices (256 CTAs); 5120 rows in 8 (320) ran 22.1 µs, in 6
    (240) 16.9 µs. (Not the sm80 thin tiles: there the same move, 5120x13824 at M=16, went 27.9 ->
    30.8 µs.) Otherwise ``s0``. Held-out sweeps, docs/notes/selection.md."""
    if columns == columns_measured:
        return s0
    if columns > columns_measured:
        if s0 == 1 or not keep_count_on_more:
            return s0
    elif columns * s0 >= FILL * sms:  # fewer columns, but the GPU stays filled
        return s0
    return max(1, min(max_splits, round(s0 * columns_measured / columns)))


def grouped_constant_checks() -> List[Tuple[str, int]]:
    """:func:`constant_checks` and the grouped families' own (their sources include gate_up.cuh)."""
    return constant_checks() + [("mixed_gemm::kGateUpBlock", GATE_UP_BLOCK)]


class OwnKernel:
    """A config that is its own compiled identity (no launch-time fields: the families outside the
    GEMM registry, ``allreduce`` and ``router``): ``kernel`` is the config, ``name`` its
    ``kernel_name``."""

    @property
    def kernel(self):
        return self

    @property
    def name(self) -> str:
        return self.kernel_name
