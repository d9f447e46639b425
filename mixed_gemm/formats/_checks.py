"""Shared argument validation for the formats layer.

Every helper raises ``TypeError`` (wrong Python type or wrong tensor dtype) or ``ValueError``
(bad value, shape, range or device) with a message of the form ``"<argument>: <rule>, got <what>"``
so callers (and tests) can tell which argument broke which rule.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

FORMATS = ("awq", "gptq", "gptq_v2", "plain", "hqq", "sparse12")
"""Checkpoint layouts understood by :func:`~mixed_gemm.formats.pack` / :func:`~mixed_gemm.formats.unpack`."""

BITS = (4, 8)
"""Bit widths of the packed int32 formats (awq, gptq) and of the kernels."""
FORMAT_BITS = {"awq": BITS, "gptq": BITS, "gptq_v2": BITS, "plain": (1, 2, 3, 4, 7, 8), "hqq": (1, 2, 3, 4, 8),
               "sparse12": (7,)}
"""Bit widths each checkpoint format carries (awq/gptq: 4 and 8; hqq: 1-4 and 8; sparse12: 7)."""
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def check_format(fmt: object) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"format: expected a str, one of {FORMATS}, got {type(fmt).__name__}")
    if fmt not in FORMATS:
        raise ValueError(f"format: expected one of {FORMATS}, got {fmt!r}")
    return fmt


def check_bits(bits: object, allowed: Sequence[int] = BITS, what: str = "") -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits: expected an int in {tuple(allowed)}, got {type(bits).__name__}")
    if bits not in allowed:
        raise ValueError(f"bits: expected one of {tuple(allowed)}{what}, got {bits}")
    return bits


def check_group_size(group_size: object) -> int:
    """``-1`` (one group spanning all of K) or a positive int."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size: expected an int (-1 or > 0), got {type(group_size).__name__}")
    if group_size != -1 and group_size <= 0:
        raise ValueError(f"group_size: expected -1 or a positive int, got {group_size}")
    return group_size


def resolve_group_size(group_size: int, k: int) -> int:
    """The effective group length along K (``-1``: ``K``)."""
    return k if group_size == -1 else group_size


def num_groups(k: int, g: int) -> int:
    """Groups along K: ``ceil(K / G)``. When ``G`` does not divide ``K`` the last group is shorter
    (``K % G`` elements; e.g. K = 576 at G = 128). AutoAWQ/GPTQ loaders require ``K % G == 0``, so
    such checkpoints are a mixed_gemm extension."""
    return -(-k // g)


def pack_factor(bits: int) -> int:
    """Number of ``bits``-wide fields in one int32 word."""
    return 32 // bits


def _dtype_list(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d) for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype],
    ndim: Optional[int] = None,
    context: str = "",
) -> torch.Tensor:
    """``t`` must be a tensor of one of ``dtypes`` with ``ndim`` dims and no zero-sized dim."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor{context}, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dtype_list(dtypes)}{context}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor{context}, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int], why: str) -> None:
    """``why`` follows the expected shape, e.g. ``" = (N, K // group_size) for N=8, K=64"``."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}{why}, got {tuple(t.shape)}")


def weight_has_wrong_n(weight_n: int, scales_n: int, scales_groups_fit: bool, zeros_n: Optional[int]) -> bool:
    """Whether an N disagreement between the weight and the scales is the weight's fault.

    N is stored in up to three tensors (weight, scales, zeros) but K only in the weight, so the
    weight is the only source of K and the scales the reference for N. Blame the weight unless the
    evidence points at the scales: their group count does not fit the weight's K (e.g. scales
    passed transposed), or the zeros carry the weight's N (two tensors against one).
    """
    return weight_n != scales_n and scales_groups_fit and zeros_n != weight_n


def check_multiple(name: str, what: str, value: int, factor: int, why: str) -> None:
    if value % factor != 0:
        raise ValueError(f"{name}: {what}={value} must be a multiple of {factor} ({why})")


def check_same_device(**tensors: Optional[torch.Tensor]) -> None:
    present = [(n, t) for n, t in tensors.items() if t is not None]
    if not present:
        return
    first_name, first = present[0]
    for n, t in present[1:]:
        if t.device != first.device:
            raise ValueError(
                f"{n}: expected the same device as {first_name} ({first.device}), got {t.device}"
            )


def check_finite(name: str, t: Optional[torch.Tensor]) -> None:
    """A floating ``t`` holds no inf/nan (``None`` and integer tensors pass). A host sync on a GPU
    tensor: for one-time checks (pack, unpack, prepack, loading), never a per-call path."""
    if t is None or not t.is_floating_point():
        return
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: expected finite values, got inf/nan ({int(bad.sum())} of {t.numel()}, the first "
                         f"at {first})")


def check_int_range(name: str, t: torch.Tensor, lo: int, hi: int) -> None:
    """All values of ``t`` lie in ``[lo, hi)``. Floating ``t`` must also hold integers."""
    if t.is_floating_point():
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}: expected finite integer values in [{lo}, {hi}), got inf/nan")
        if not bool((t == torch.round(t)).all()):
            raise ValueError(f"{name}: expected integer values in [{lo}, {hi}), got non-integers")
    lo_v, hi_v = t.min().item(), t.max().item()
    if lo_v < lo or hi_v >= hi:
        raise ValueError(f"{name}: expected values in [{lo}, {hi}), got min {lo_v:g}, max {hi_v:g}")


def check_g_idx(g_idx: object, k: int, num_groups: int, device: torch.device) -> torch.Tensor:
    """``g_idx``: integer ``(K,)`` tensor with values in ``[0, num_groups)`` on ``device``."""
    g = check_tensor("g_idx", g_idx, dtypes=INDEX_DTYPES, ndim=1)
    check_shape("g_idx", g, (k,), " (one group index per input channel, K)")
    if g.device != device:
        raise ValueError(f"g_idx: expected the same device as the weight ({device}), got {g.device}")
    check_int_range("g_idx", g, 0, num_groups)
    return g
