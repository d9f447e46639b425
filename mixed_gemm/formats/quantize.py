"""Round-to-nearest group-wise quantization of a float weight to canonical ``(q, s, z)``."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _checks as C


def _round_up_to(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``s`` (float32) cast to ``dtype``, rounded towards +inf so that ``stored >= s``."""
    out = s.to(dtype)
    return torch.where(out.float() < s, torch.nextafter(out, torch.full_like(out, float("inf"))), out)


QUANTIZE_BITS = (1, 2, 3, 4, 7, 8)  # 7: the 1:2 sparse format (formats/sparse.py)


def quantize(
    w: torch.Tensor,
    *,
    bits: int = 4,
    group_size: int = 128,
    symmetric: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Group-wise round-to-nearest quantization of ``w`` ``(N, K)`` to canonical ``(q, s, z)``.

    Groups are ``G`` consecutive input channels of one output row (``group_size=-1``: ``G = K``).
    All arithmetic is float32; ``maxq = 2**bits - 1``.

    * Asymmetric (default): with ``lo = min(min(group), 0)`` and ``hi = max(max(group), 0)`` (the range is
      widened to contain 0, as GPTQ does, so the integer zero point always lies in ``[0, maxq]``;
      for groups that straddle 0, the usual case, this is plain min/max),
      ``s = (hi - lo) / maxq``, ``z = clamp(round(-lo / s), 0, maxq)``,
      ``q = clamp(round(w / s) + z, 0, maxq)``.
    * Symmetric: ``z = None`` (implicit zero ``2**(bits-1)``), ``s = max|group| / (2**(bits-1) - 1)``,
      ``q = clamp(round(w / s) + 2**(bits-1), 0, maxq)`` (so ``q`` never uses the value 0).

    A group whose ``s`` would be 0 (all zeros) gets ``s = 1`` (then ``q = z`` resp. ``2**(bits-1)``), so
    nothing is NaN.  ``s`` is rounded *up* to the output dtype before ``z`` and ``q`` are computed from
    the stored value, which guarantees ``|w - (q - z) * s| <= s / 2`` (up to float32 rounding) for every
    element, with ``s`` the returned scale.  Results are bit-identical on CPU and CUDA.

    Args:
        w: float16 / bfloat16 / float32 ``(N, K)``, finite.
        bits: 2, 3, 4, 7 or 8 (the kernels serve 4 and 8).
        group_size: ``G`` > 0 dividing K, or ``-1``.
        symmetric: see above.

    Returns:
        ``q`` uint8 ``(N, K)`` in ``[0, 2**bits)``; ``s`` ``(N, K // G)`` in ``w.dtype`` for float16 /
        bfloat16 input and float16 for float32 input; ``z`` same shape and dtype as ``s`` holding
        integers in ``[0, maxq]``, or ``None`` when ``symmetric``.

    Raises:
        TypeError: ``w`` not a float16/bfloat16/float32 tensor, non-int ``bits``/``group_size``,
            non-bool ``symmetric``.
        ValueError: ``w`` not 2-D / empty / non-finite, bits not in {1, 2, 3, 4, 7, 8}, bad group size, K not
            divisible by the group size, scales that overflow the output dtype.
    """
    C.check_tensor("w", w, dtypes=C.SCALE_DTYPES, ndim=2)
    bits = C.check_bits(bits, QUANTIZE_BITS)
    group_size = C.check_group_size(group_size)
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric: expected a bool, got {type(symmetric).__name__}")
    n, k = w.shape
    g = C.resolve_group_size(group_size, k)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w: expected finite values, got inf/nan")
    out_dtype = w.dtype if w.dtype in (torch.float16, torch.bfloat16) else torch.float16
    maxq = (1 << bits) - 1
    ng = C.num_groups(k, g)
    wf = w.float()
    if ng * g != k:  # a shorter last group: pad it with copies of its first column (no new extremes)
        wf = torch.cat([wf, wf[:, (ng - 1) * g:(ng - 1) * g + 1].expand(n, ng * g - k)], dim=1)
    wg = wf.reshape(n, ng, g)
    # Divide by a full tensor, not a Python scalar: CUDA turns division by a scalar into multiplication
    # by its reciprocal, which differs in the last bit and would make CPU and CUDA results disagree.
    if symmetric:
        span = wg.abs().amax(dim=-1)
        s = span / torch.full_like(span, (1 << (bits - 1)) - 1)
    else:
        lo = wg.amin(dim=-1).clamp(max=0.0)
        span = wg.amax(dim=-1).clamp(min=0.0) - lo
        s = span / torch.full_like(span, maxq)
    s = torch.where(s == 0, torch.ones_like(s), s)
    s_out = _round_up_to(s, out_dtype)
    if not bool(torch.isfinite(s_out).all()):
        raise ValueError(f"w: values too large, the scales overflow {out_dtype}")
    sf = s_out.float()
    if symmetric:
        zf = torch.full_like(sf, float(1 << (bits - 1)))
    else:
        zf = torch.round(-lo / sf).clamp(0, maxq)
    q = (torch.round(wg / sf.unsqueeze(-1)) + zf.unsqueeze(-1)).clamp(0, maxq)
    z = None if symmetric else zf.to(out_dtype)
    return q.to(torch.uint8).reshape(n, ng * g)[:, :k].contiguous(), s_out, z
