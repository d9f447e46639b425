"""Checkpoint layouts <-> canonical ``(q, s, z)``: :func:`unpack` and its exact inverse :func:`pack`.

Canonical form (what every other part of mixed_gemm consumes)
-------------------------------------------------------------
Weight ``W`` is ``(N, K)`` = (out_features, in_features); ``G`` = ``group_size`` (``-1`` -> ``G = K``),
``NG = ceil(K / G)`` groups along K (the last one shorter when ``G`` does not divide ``K``: a
mixed_gemm extension, AutoAWQ and GPTQ loaders require ``K % G == 0``).

* ``q``: ``torch.uint8`` ``(N, K)``, values in ``[0, 2**bits)``, row-major, in the original K order
  (also under act-order: ``g_idx`` never permutes ``q``).
* ``s``: ``(N, NG)`` in float16 / bfloat16 / float32 (the checkpoint's scales dtype).
* ``z``: same shape and dtype as ``s``, holding integers in ``[0, 2**bits)``; or ``None`` for symmetric
  weights (the implicit zero is ``2**(bits-1)``).
* Group of element ``(n, k)``: ``k // G``, or ``g_idx[k]`` when a ``g_idx`` (GPTQ act-order) is given.
  Dequantized weight: ``W[n, k] = (q[n, k] - z[n, grp]) * s[n, grp]``.

Checkpoint formats (``P = 32 // bits`` fields per int32 word; field ``i`` = bits ``[bits*i, bits*i+bits)``
of the word's two's-complement pattern, so the last field contains the sign bit)
--------------------------------------------------------------------------------------------------
``"awq"`` (AutoAWQ GEMM):
    ``qweight`` int32 ``(K, N // P)``: word ``[k, j]``, field ``i`` = ``q[P*j + order[i], k]``.
    ``qzeros`` int32 ``(NG, N // P)``: word ``[g, j]``, field ``i`` = ``z[P*j + order[i], g]``.
    ``scales`` ``(NG, N)`` = ``s.T``.
    ``order`` = ``AWQ_ORDER[bits]``: 4-bit ``(0, 2, 4, 6, 1, 3, 5, 7)`` (AutoAWQ's ``order_map``);
    8-bit ``(0, 1, 2, 3)``: AutoAWQ only implements 4-bit GEMM packing (``from_linear`` raises
    ``NotImplementedError`` for other widths), so there is no upstream interleave; we use plain order.
``"gptq"`` (AutoGPTQ / GPTQ-for-LLaMa "v1"):
    ``qweight`` int32 ``(K // P, N)``: word ``[r, n]``, field ``i`` = ``q[n, P*r + i]`` (packed along K,
    least-significant field first).
    ``qzeros`` int32 ``(NG, N // P)``: word ``[g, j]``, field ``i`` = ``(z[P*j + i, g] - 1) mod 2**bits``
    (packed along N, plain order, stored minus one).  Unpacking reads ``z = (field + 1) mod 2**bits``,
    exactly like AutoGPTQ's torch dequantizer (``bitwise_and(zeros + 1, 2**bits - 1)``), so the map is a
    bijection on ``[0, 2**bits)``: ``z = 0`` is stored as ``2**bits - 1`` (``0xF`` / ``0xFF``) and
    stored ``2**bits - 1`` reads back as ``0``.  (Kernels that add one *without* wrapping, e.g. exllama,
    would see 16 / 256 there; such zeros are not representable canonically.  AutoGPTQ's numpy packer
    lets a ``-1`` bleed into the higher fields of the word; :func:`pack` masks, so neighbours are intact.)
    ``scales`` ``(NG, N)`` = ``s.T``.  Optional ``g_idx`` int ``(K,)`` with values in ``[0, NG)``.
``"gptq_v2"``: as ``"gptq"`` but ``qzeros`` fields store ``z`` itself (no minus one).
``"plain"``: ``(qweight, scales, zeros)`` *are* ``(q, s, z)``; validated and returned unchanged.
``"hqq"``: the ``hqq`` package's bit-packed ``W_q`` (1, 2, 3, 4 or 8 bits) with its per-group
    ``meta["scale"]`` and float ``meta["zero"]`` (``zero_mode="float"``, ``w = (q - z) s``); needs
    ``shape=(N, K)``. Layout and packing: :mod:`mixed_gemm.formats.hqq`.
``"sparse12"``: 1:2-sparse 7-bit (``bits=7``): ``qweight`` uint8 ``(N, K / 2)``, one byte per pair
    along K (7-bit code | position << 7), ``scales``/``zeros`` as in the canonical form
    (:mod:`mixed_gemm.formats.sparse`; :func:`mixed_gemm.sparsify_quantize` makes such weights).

Symmetric weights: ``zeros=None`` in, ``None`` out, for every format.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _checks as C
from . import hqq as _hqq
from . import sparse as _sparse
from ._bitpack import pack_last, unpack_last

AWQ_ORDER = {4: (0, 2, 4, 6, 1, 3, 5, 7), 8: (0, 1, 2, 3)}
# What ``z`` holds (``zero_mode`` of pack/unpack, as in mixed_gemm.reference): "int" integer zero
# points in [0, 2**bits), w = (q - z) s; "float" any finite zero point, same formula (HQQ);
# "offset" a per-group offset m, w = q s + m (GGUF Q4_1). Only "plain" carries the last two.
ZERO_MODES = ("int", "float", "offset")
"""Field ``i`` of an AWQ word holds column ``P*j + AWQ_ORDER[bits][i]`` of its group of ``P`` columns."""

Triple = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


def resolve_zero_mode(zero_mode, fmt) -> str:
    """What ``zeros`` of format ``fmt`` hold given the ``zero_mode`` argument (checked): ``"hqq"`` is
    always ``"float"``; the others hold what the argument says."""
    if zero_mode not in ZERO_MODES:
        raise ValueError(f"zero_mode: expected one of {ZERO_MODES}, got {zero_mode!r}")
    if fmt == "hqq":  # HQQ's zero points are floats; the default "int" means "what the format holds"
        if zero_mode == "offset":
            raise ValueError("zero_mode: format 'hqq' stores float zero points (w = (q - z) s), not offsets")
        return "float"
    if zero_mode != "int" and fmt != "plain":
        raise ValueError(f"zero_mode: format {fmt!r} stores integer zero points; {zero_mode!r} needs format='plain'")
    return zero_mode


def _validate_canonical(q, s, z, *, bits, group_size, g_idx, fmt, names=("q", "s", "z"), zero_mode="int"):
    """Check a canonical triple; returns ``(N, K)``."""
    qn, sn, zn = names
    ctx = f" for format {fmt!r}"
    C.check_tensor(qn, q, dtypes=(torch.uint8,), ndim=2, context=ctx)
    C.check_tensor(sn, s, dtypes=C.SCALE_DTYPES, ndim=2, context=ctx)
    if z is not None:
        C.check_tensor(zn, z, dtypes=(s.dtype,), ndim=2, context=f" (same as {sn})")
    C.check_same_device(**{qn: q, sn: s, zn: z})
    n, k = q.shape
    g = C.resolve_group_size(group_size, k)
    # q is checked first: a q with the wrong N used to be reported as an s shape error.
    if C.weight_has_wrong_n(n, s.shape[0], s.shape[1] == C.num_groups(k, g), None if z is None else z.shape[0]):
        C.check_shape(qn, q, (s.shape[0], k), f" = (N, K) for format {fmt!r}, N={s.shape[0]} (from {sn} {tuple(s.shape)}), K={k}")
    C.check_shape(sn, s, (n, C.num_groups(k, g)), f" = (N, ceil(K / group_size)) for N={n}, K={k}, group_size={group_size}")
    if z is not None:
        C.check_shape(zn, z, tuple(s.shape), f" (same as {sn})")
    C.check_int_range(qn, q, 0, 1 << bits)
    C.check_finite(sn, s)  # a corrupt checkpoint's nan scale would surface only as nan outputs
    if z is not None and zero_mode == "int":
        C.check_int_range(zn, z, 0, 1 << bits)
    else:
        C.check_finite(zn, z)
    if g_idx is not None:
        C.check_g_idx(g_idx, k, C.num_groups(k, g), q.device)
    return n, k


def _reject_g_idx(g_idx, fmt):
    if g_idx is not None:
        raise ValueError(f"g_idx: format {fmt!r} has no act-order; g_idx must be None")


def _validate_packed(qweight, scales, zeros, *, bits, group_size, g_idx, fmt):
    """Check a packed awq/gptq triple; returns ``(N, K)``."""
    p = C.pack_factor(bits)
    ctx = f" for format {fmt!r}"
    C.check_tensor("qweight", qweight, dtypes=(torch.int32,), ndim=2, context=ctx)
    C.check_tensor("scales", scales, dtypes=C.SCALE_DTYPES, ndim=2, context=ctx)
    if zeros is not None:
        C.check_tensor("zeros", zeros, dtypes=(torch.int32,), ndim=2, context=ctx)
    C.check_same_device(qweight=qweight, scales=scales, zeros=zeros)
    if fmt == "awq":
        k, n = qweight.shape[0], qweight.shape[1] * p
    else:
        k, n = qweight.shape[0] * p, qweight.shape[1]
    g = C.resolve_group_size(group_size, k)
    # qweight is checked first: one with the wrong N used to be reported as a scales shape error.
    # Only the N side of qweight can be checked (K is stored nowhere else): its packed columns
    # for awq (K, N // P), its unpacked columns for gptq (K // P, N).
    n_s = scales.shape[1]
    if C.weight_has_wrong_n(n, n_s, scales.shape[0] == C.num_groups(k, g), None if zeros is None else zeros.shape[1] * p):
        if fmt == "awq" and n_s % p == 0:
            C.check_shape("qweight", qweight, (k, n_s // p),
                          f" = (K, N // {p}) for format 'awq', N={n_s} (from scales {tuple(scales.shape)}), K={k}")
        elif fmt != "awq":  # (an awq N that is no multiple of P is the scales' fault: checked below)
            C.check_shape("qweight", qweight, (qweight.shape[0], n_s),
                          f" = (K // {p}, N) for format {fmt!r}, N={n_s} (from scales {tuple(scales.shape)}), K={k}")
    C.check_shape("scales", scales, (C.num_groups(k, g), n), f" = (ceil(K / group_size), N) for K={k}, N={n}, group_size={group_size}")
    if zeros is not None:
        C.check_multiple("zeros", "N", n, p, f"{bits}-bit zeros pack {p} per int32 along N")
        C.check_shape("zeros", zeros, (C.num_groups(k, g), n // p), f" = (ceil(K / group_size), N // {p}) for K={k}, N={n}, group_size={group_size}")
    C.check_finite("scales", scales)
    if fmt == "awq":
        _reject_g_idx(g_idx, fmt)
    elif g_idx is not None:
        C.check_g_idx(g_idx, k, C.num_groups(k, g), qweight.device)
    return n, k


def check_format_args(format, bits, group_size) -> Tuple[str, int, int]:
    """``(format, bits, group_size)`` checked as :func:`unpack` checks them (the bits the format carries)."""
    fmt = C.check_format(format)
    return fmt, C.check_bits(bits, C.FORMAT_BITS[fmt], f" for format {fmt!r}"), C.check_group_size(group_size)


def unpack(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: Optional[torch.Tensor],
    *,
    format: str,
    bits: int = 4,
    group_size: int = 128,
    g_idx: Optional[torch.Tensor] = None,
    zero_mode: str = "int",
    shape: Optional[Tuple[int, int]] = None,
) -> Triple:
    """Checkpoint tensors -> canonical ``(q, s, z)`` (see the module docstring for every layout).

    Args:
        qweight: packed int32 weight (``"awq"``: ``(K, N // P)``; ``"gptq"``/``"gptq_v2"``:
            ``(K // P, N)``; ``"plain"``: the canonical uint8 ``q`` ``(N, K)``), ``P = 32 // bits``.
        scales: ``(K // G, N)`` float16/bfloat16/float32 (``"plain"``: ``s`` ``(N, K // G)``).
        zeros: packed int32 ``(K // G, N // P)`` (``"plain"``: ``z``, like ``s``), or ``None`` (symmetric).
        format: ``"awq"``, ``"gptq"``, ``"gptq_v2"``, ``"plain"`` or ``"hqq"``.
        bits: 4 or 8 (``"plain"`` and ``"hqq"``: also 1, 2, 3; the kernels serve 4 and 8).
        group_size: ``G`` > 0 dividing K, or ``-1`` for one group per output channel.
        g_idx: GPTQ act-order group index, int ``(K,)`` with values in ``[0, K // G)``; only for
            ``"gptq"``, ``"gptq_v2"`` and ``"plain"``.  It is validated, not applied: ``q`` stays in
            the original K order and ``s``/``z`` are indexed by group; keep ``g_idx`` and pass it to
            :func:`mixed_gemm.reference.dequantize` or :func:`expand_groups`.
        zero_mode: what ``zeros`` holds (see ``ZERO_MODES``); ``"hqq"`` always holds float zeros.
        shape: ``(N, K)``, for ``"hqq"`` only (its tensors do not hold them).

    Returns:
        ``q`` uint8 ``(N, K)`` in ``[0, 2**bits)``; ``s`` ``(N, K // G)`` in ``scales.dtype``; ``z`` like
        ``s`` holding integers in ``[0, 2**bits)`` (``"gptq"``: ``(stored + 1) mod 2**bits``), or ``None``.
        All contiguous, on the input device.  ``"plain"`` returns its inputs themselves.

    Raises:
        TypeError: wrong argument type or tensor dtype.
        ValueError: unknown format, bits not in {4, 8}, bad group size, shapes that disagree,
            out-of-range values (``"plain"``, ``g_idx``), tensors on different devices.
    """
    fmt, bits, group_size = check_format_args(format, bits, group_size)
    zero_mode = resolve_zero_mode(zero_mode, fmt)
    if shape is not None and fmt != "hqq":
        raise ValueError(f"shape: only format 'hqq' takes shape (the others hold N and K), got format {fmt!r}")
    if fmt == "plain":
        _validate_canonical(qweight, scales, zeros, bits=bits, group_size=group_size, g_idx=g_idx,
                            fmt=fmt, names=("qweight", "scales", "zeros"), zero_mode=zero_mode)
        return qweight, scales, zeros
    if fmt == "sparse12":
        _reject_g_idx(g_idx, fmt)
        C.check_tensor("qweight", qweight, dtypes=(torch.uint8,), ndim=2, context=" for format 'sparse12'")
        C.check_tensor("scales", scales, dtypes=C.SCALE_DTYPES, ndim=2, context=" for format 'sparse12'")
        k = 2 * qweight.shape[1]
        g = C.resolve_group_size(group_size, k)
        if qweight.shape[0] != scales.shape[0] or scales.shape[1] != C.num_groups(k, g):
            raise ValueError(f"scales: format 'sparse12' is (N, K / group_size) = ({qweight.shape[0]}, "
                             f"{C.num_groups(k, g)}) for qweight {tuple(qweight.shape)}, got {tuple(scales.shape)}")
        if zeros is not None:
            C.check_tensor("zeros", zeros, dtypes=(scales.dtype,), ndim=2, context=" (same as scales)")
            C.check_shape("zeros", zeros, tuple(scales.shape), " (same as scales)")
        C.check_finite("scales", scales)
        q = _sparse.unpack(qweight, scales, zeros, g)
        _validate_canonical(q, scales, zeros, bits=bits, group_size=group_size, g_idx=None, fmt=fmt,
                            names=("q", "scales", "zeros"))
        return q, scales, zeros
    if fmt == "hqq":
        _reject_g_idx(g_idx, fmt)
        C.check_tensor("scales", scales, dtypes=C.SCALE_DTYPES, context=" for format 'hqq'")
        q, s, z = _hqq.unpack(qweight, scales, zeros, bits, group_size, shape)
        _validate_canonical(q, s, z, bits=bits, group_size=group_size, g_idx=None, fmt=fmt, zero_mode=zero_mode,
                            names=("q", "scales", "zeros"))
        return q, s, z
    _validate_packed(qweight, scales, zeros, bits=bits, group_size=group_size, g_idx=g_idx, fmt=fmt)
    s = scales.t().contiguous()
    if fmt == "awq":
        order = AWQ_ORDER[bits]
        q = unpack_last(qweight, bits, order).t().contiguous()
        zq = None if zeros is None else unpack_last(zeros, bits, order)
    else:
        q = unpack_last(qweight.t(), bits)
        zq = None if zeros is None else unpack_last(zeros, bits)
        if zq is not None and fmt == "gptq":
            zq = (zq.to(torch.int16) + 1) & ((1 << bits) - 1)
    z = None if zq is None else zq.t().to(s.dtype).contiguous()
    return q.contiguous(), s, z


def pack(
    q: torch.Tensor,
    s: torch.Tensor,
    z: Optional[torch.Tensor],
    *,
    format: str,
    bits: int = 4,
    group_size: int = 128,
    g_idx: Optional[torch.Tensor] = None,
    zero_mode: str = "int",
) -> Triple:
    """Canonical ``(q, s, z)`` -> checkpoint ``(qweight, scales, zeros)``; exact inverse of :func:`unpack`
    (``"hqq"``: ``(W_q, scale (R, 1), zero (R, 1))``, unpacked with ``shape=q.shape``).

    Args:
        q: uint8 ``(N, K)`` with values in ``[0, 2**bits)``.
        s: ``(N, K // G)`` float16/bfloat16/float32.
        z: same shape and dtype as ``s`` holding integers in ``[0, 2**bits)``, or ``None`` (symmetric).
        format, bits, group_size: as for :func:`unpack`.
        g_idx: optional act-order index (``"gptq"``, ``"gptq_v2"``, ``"plain"`` only); validated
            against ``q``/``s`` but not stored: the checkpoint keeps it as its own tensor.

    Returns:
        ``qweight`` int32 (``"awq"``: ``(K, N // P)`` with ``AWQ_ORDER[bits]``; ``"gptq"``/``"gptq_v2"``:
        ``(K // P, N)`` packed along K), ``scales`` = ``s.T`` ``(K // G, N)`` in ``s.dtype``, ``zeros``
        int32 ``(K // G, N // P)`` (``"gptq"`` stores ``(z - 1) mod 2**bits``) or ``None``; all
        contiguous.  ``"plain"`` returns its inputs themselves.
        Requires ``N % P == 0`` (awq; gptq when ``z`` is given) and ``K % P == 0`` (gptq).

    Raises:
        TypeError / ValueError: as for :func:`unpack`, naming ``q``, ``s``, ``z`` or ``g_idx``.
    """
    fmt, bits, group_size = check_format_args(format, bits, group_size)
    zero_mode = resolve_zero_mode(zero_mode, fmt)
    if fmt == "awq":
        _reject_g_idx(g_idx, fmt)
    n, k = _validate_canonical(q, s, z, bits=bits, group_size=group_size, g_idx=g_idx, fmt=fmt,
                               zero_mode=zero_mode)
    if fmt == "plain":
        return q, s, z
    if fmt == "sparse12":
        _reject_g_idx(g_idx, fmt)
        return _sparse.pack(q, s, z, C.resolve_group_size(group_size, k)), s, z
    if fmt == "hqq":
        _reject_g_idx(g_idx, fmt)
        if group_size != -1 and k % group_size:
            raise ValueError(f"q: format 'hqq' groups {group_size} consecutive elements along K; K={k} is no multiple")
        return _hqq.pack(q, s, z, bits)
    p = C.pack_factor(bits)
    if fmt == "awq":
        C.check_multiple("q", "N", n, p, f"format 'awq' packs {p} {bits}-bit values per int32 along N")
    else:
        C.check_multiple("q", "K", k, p, f"format {fmt!r} packs {p} {bits}-bit values per int32 along K")
        if z is not None:
            C.check_multiple("z", "N", n, p, f"format {fmt!r} packs {p} {bits}-bit zeros per int32 along N")
    scales = s.t().contiguous()
    zi = None if z is None else z.t().to(torch.int32)
    if fmt == "awq":
        order = AWQ_ORDER[bits]
        qweight = pack_last(q.t(), bits, order)
        zeros = None if zi is None else pack_last(zi, bits, order)
    else:
        qweight = pack_last(q, bits).t().contiguous()
        if zi is not None and fmt == "gptq":
            zi = (zi - 1) & ((1 << bits) - 1)
        zeros = None if zi is None else pack_last(zi, bits)
    return qweight, scales, zeros
