"""One tensor-parallel rank's part of a quantized linear layer, cut from its checkpoint tensors.

``W`` is ``(N, K)`` (out, in); ``G`` = ``group_size`` (``-1``: one group of ``K``); ``P = 32 // bits``
values per int32; ``tp`` = ``tp_size``, ``r`` = ``tp_rank``; formats as in :mod:`mixed_gemm.formats`.

Column-parallel (q/k/v, gate/up): rank ``r`` keeps output rows ``[n0, n1) = [r N/tp, (r+1) N/tp)``
and all of K. Rules: ``N % tp == 0``; ``N/tp`` even (the kernels store outputs in pairs); ``N/tp % P
== 0`` where the format packs along N (awq ``qweight`` and ``qzeros``; gptq ``qzeros``)::

    awq            qweight[:, n0/P:n1/P]  scales[:, n0:n1]  qzeros[:, n0/P:n1/P]
    gptq, gptq_v2  qweight[:, n0:n1]      scales[:, n0:n1]  qzeros[:, n0/P:n1/P]  g_idx whole
    plain, sparse12  rows n0:n1 of qweight, scales, zeros                         g_idx whole
    bias[n0:n1]

Act-order stays as it is (every row shares the K permutation). ``prepack`` pads each shard by
itself (N to 64, K to 16): no padding lies between shards, and shards of one rank concatenate
(``fuse_projections``: q_r | k_r | v_r).

Row-parallel (o, down): rank ``r`` keeps input columns ``[k0, k1) = [r K/tp, (r+1) K/tp)`` and all of
N; groups ``[g0, g1) = [k0/G, k1/G)``. Rules: ``K % tp == 0``; ``K/tp % 8 == 0`` (x rows are loaded
16 bytes at a time); ``K/tp % G == 0`` (whole groups per shard) unless per-channel (``G = -1``:
scales and zeros replicated) or act-order; gptq ``K/tp % P == 0`` (``qweight`` packs P rows)::

    awq            qweight[k0:k1]      scales[g0:g1]  qzeros[g0:g1]
    gptq, gptq_v2  qweight[k0/P:k1/P]  scales[g0:g1]  qzeros[g0:g1]
    plain          q[:, k0:k1]         s[:, g0:g1]    z[:, g0:g1]      (sparse12: qweight[:, k0/2:k1/2])
    bias: rank 0 only (added once, before the all-reduce)

Act-order (GPTQ ``desc_act``, a ``g_idx``) under row-parallel: ``g_idx[k0:k1]`` goes with the rows;
such a slice holds members of any group, so scales and zeros are read whole (as vLLM does) and
the shard is regrouped (:func:`regroup`) into contiguous groups the kernels read: its columns are
sorted by group and each group's run is padded with zero weights (the zero code) to a multiple of
a power-of-two ``G' <= G``, ``G' >= 32``, chosen for the fewest bytes; an ``input_index`` says
which column of ``x``'s slice each weight column reads. A checkpoint whose slices hold whole
groups needs no padding (``G' = G``). Needs integer zero points (the padding must be exactly 0).

``"hqq"``: ``W_q`` interleaves rows ``i + j R/P`` over the whole tensor (:mod:`~mixed_gemm.formats.hqq`),
so its tensors are read whole and unpacked on their device (the CPU when loading) and the shard
is cut from the canonical form (``format="plain"``, float zeros). Inputs may be tensors or
safetensors slices (``safe_open(...).get_slice(key)``): only this rank's part of those is read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..formats import check_format_args, check_g_idx, unpack
from ..nn.parallel import ColumnParallelQuantLinear, RowParallelQuantLinear, check_tp_rank
from ..nn.quant_linear import QuantLinear
from ..ops import PackedWeight, prepack

STYLES = ("column", "row")
KERNEL_K_MULTIPLE = 8  # prepack's rule on K (16-byte loads of x rows)


@dataclass(frozen=True)
class Shard:
    """Rank ``tp_rank``'s part of a quantized weight as checkpoint tensors ``prepack`` reads.

    ``n``, ``k``: the widths this rank's ``y`` and ``x`` slices have (``(N/tp, K)`` column-parallel,
    ``(N, K/tp)`` row-parallel). ``input_index``: for a regrouped act-order row shard, the column of
    the ``x`` slice each weight column reads (``x.index_select(-1, input_index)``), else ``None``.
    ``bias``: the rank's part (row-parallel: the whole bias on rank 0, ``None`` elsewhere)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    format: str
    bits: int
    group_size: int
    style: str
    tp_rank: int
    tp_size: int
    n: int
    k: int
    g_idx: Optional[torch.Tensor] = None
    zero_mode: str = "int"
    input_index: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None

    def prepack(self, *, dtype: torch.dtype = torch.float16, layout: str = "auto") -> PackedWeight:
        """The shard as a :class:`~mixed_gemm.PackedWeight` on its tensors' device."""
        return prepack(self.qweight, self.scales, self.zeros, format=self.format, bits=self.bits,
                       group_size=self.group_size, g_idx=self.g_idx, zero_mode=self.zero_mode, dtype=dtype,
                       layout=layout)


# ------------------------------------------------------------------ rules
def _shape(t) -> Tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t.get_shape())  # a safetensors slice


def check_sources(qweight, scales, zeros, format, bits, group_size) -> None:
    """Types and ranks of the checkpoint tensors (tensors or safetensors slices) and the format
    arguments, before any shape is derived from them."""
    check_format_args(format, bits, group_size)
    for name, t in (("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        if t is None and name != "zeros":
            raise TypeError(f"{name}: expected a torch.Tensor or a safetensors slice, got None")
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) and not hasattr(t, "get_shape"):
            raise TypeError(f"{name}: expected a torch.Tensor or a safetensors slice, got {type(t).__name__}")
        if len(_shape(t)) != 2:
            raise ValueError(f"{name}: expected a 2-D tensor, got shape {_shape(t)}")


def checkpoint_dims(qweight, scales, fmt: str, bits: int) -> Tuple[int, int]:
    """``(N, K)`` of a checkpoint's tensors (not hqq: unpacked first)."""
    qs = _shape(qweight)
    if fmt == "awq":
        return _shape(scales)[1], qs[0]
    if fmt in ("gptq", "gptq_v2"):
        return qs[1], qs[0] * (32 // bits)
    return (qs[0], 2 * qs[1]) if fmt == "sparse12" else qs


def check_shardable(n: int, k: int, *, style: str, tp_size: int, format: str, bits: int, group_size: int,
                    act_order: bool = False, has_zeros: bool = True) -> Tuple[int, int]:
    """The shard's ``(N, K)``; raises ``ValueError`` naming the rule a ``(N, K)`` weight breaks
    (module docstring), before anything is read."""
    if style not in STYLES:
        raise ValueError(f"style: expected one of {STYLES}, got {style!r}")
    p = 32 // bits
    if style == "column":
        if n % tp_size:
            raise ValueError(f"tp_size: column-parallel splits N={n} into {tp_size} equal shards; N must be a "
                             f"multiple of tp_size")
        ns = n // tp_size
        if ns % 2:
            raise ValueError(f"tp_size: column-parallel N/tp_size={ns} must be even (the kernels store outputs in pairs)")
        if (format == "awq" or (format in ("gptq", "gptq_v2") and has_zeros)) and ns % p:
            what = "qweight and qzeros" if format == "awq" else "qzeros"
            raise ValueError(f"tp_size: column-parallel N/tp_size={ns} must be a multiple of {p} (format {format!r} "
                             f"packs {p} {bits}-bit columns per int32 in {what})")
        return ns, k
    if k % tp_size:
        raise ValueError(f"tp_size: row-parallel splits K={k} into {tp_size} equal shards; K must be a multiple "
                         f"of tp_size")
    ks = k // tp_size
    if ks % KERNEL_K_MULTIPLE:
        raise ValueError(f"tp_size: row-parallel K/tp_size={ks} must be a multiple of {KERNEL_K_MULTIPLE} "
                         f"(the kernels load x rows 16 bytes at a time)")
    if group_size != -1 and not act_order and ks % group_size:
        raise ValueError(f"tp_size: row-parallel shards K in whole groups: K/tp_size={ks} must be a multiple of "
                         f"group_size={group_size}")
    if format in ("gptq", "gptq_v2") and ks % p:
        raise ValueError(f"tp_size: row-parallel K/tp_size={ks} must be a multiple of {p} (format {format!r} packs "
                         f"{p} {bits}-bit rows per int32 along K)")
    return n, ks


# ------------------------------------------------------------------ act-order row shards
def regroup(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], g_idx: torch.Tensor, *,
            group_size: int, bits: int):
    """An act-order shard -> contiguous groups: ``(q', s', z', G', input_index)``.

    ``q`` uint8 ``(N, Ks)`` (this rank's columns, original order), ``s``/``z`` ``(N, NG)`` (every
    group), ``g_idx`` ``(Ks,)``. Columns are sorted by group (stably); each group's run of ``c``
    columns becomes ``ceil(c / G')`` groups of ``G'`` columns sharing its scale and zero, the last
    one padded with the zero code (weight exactly 0; ``input_index`` 0 there). ``G'`` is the
    power of two in ``[32, G]`` giving the fewest bytes. ``input_index`` ``(K',)`` is ``None``
    when it is the identity (the slice held whole groups in order)."""
    ks, ng = q.shape[1], s.shape[1]
    gi = g_idx.to(device=q.device, dtype=torch.int64)
    counts = torch.bincount(gi, minlength=ng)
    per_group = 16 * (2 if z is not None else 1)  # bits of scale (+ zero) per group and output row
    best = None
    g2 = group_size
    while g2 >= 32:  # prepack's group rule: a power of two >= 32
        subs = (counts + g2 - 1) // g2
        cost = int(subs.sum()) * (g2 * bits + per_group)
        if best is None or cost < best[0]:
            best = (cost, g2, subs)
        g2 //= 2
    if best is None:
        raise ValueError(f"group_size: an act-order row-parallel shard is regrouped into groups of a power of two "
                         f">= 32 dividing group_size; got group_size={group_size}")
    _, g2, subs = best
    order = torch.argsort(gi, stable=True)
    first = torch.cumsum(counts, 0) - counts  # where each group starts in the sorted columns
    start = (torch.cumsum(subs, 0) - subs) * g2  # where each group starts in the regrouped columns
    sorted_g = gi[order]
    dest = start[sorted_g] + torch.arange(ks, device=q.device) - first[sorted_g]
    k2 = int(subs.sum()) * g2
    index = torch.full((k2,), -1, dtype=torch.int64, device=q.device)
    index[dest] = order
    owner = torch.repeat_interleave(torch.arange(ng, device=q.device), subs)  # group of each new group
    s2 = s[:, owner].contiguous()
    z2 = None if z is None else z[:, owner].contiguous()
    gather = index.clamp(min=0)
    q2 = q.index_select(1, gather)
    pad = index < 0
    if bool(pad.any()):
        zero = torch.full_like(s2, float(1 << (bits - 1))) if z2 is None else z2
        q2 = torch.where(pad, zero.repeat_interleave(g2, dim=1).to(torch.uint8), q2)
    identity = k2 == ks and torch.equal(gather, torch.arange(ks, device=q.device))
    return q2.contiguous(), s2, z2, g2, None if identity else gather


def _act_order_canonical(qweight, scales, zeros, fmt: str, bits: int):
    """Canonical ``q`` ``(N, Ks)`` of a row slice and ``s``, ``z`` ``(N, NG)`` of every group: the
    slice's K and the whole scales disagree, so each comes from its own ``unpack`` (codes with
    per-channel stand-in scales; scales and zeros with a stand-in qweight of ``P`` rows per group)."""
    if fmt == "plain":
        return qweight, scales, zeros
    q = unpack(qweight, scales[:1], None, format=fmt, bits=bits, group_size=-1)[0]
    p = 32 // bits
    stand_in = torch.zeros((scales.shape[0], scales.shape[1]), dtype=torch.int32, device=scales.device)
    _, s, z = unpack(stand_in, scales, zeros, format=fmt, bits=bits, group_size=p)
    return q, s, z


# ------------------------------------------------------------------ cutting
def _read(t) -> Optional[torch.Tensor]:
    """A tensor, or what a safetensors slice reads (its part of the file only)."""
    return None if t is None else t[:].contiguous()


def _to(t, device):
    return t if t is None or device is None else t.to(device)


def rank_shard(qweight, scales, zeros=None, *, style: str, tp_rank: int, tp_size: int, format: str, bits: int = 4,
               group_size: int = 128, g_idx=None, zero_mode: str = "int", shape=None, bias=None,
               device=None) -> Shard:
    """A :class:`Shard` from tensors already cut for this rank (a server's weight loader, a
    checkpoint saved per rank): column-parallel the ``(N/tp, K)`` checkpoint, row-parallel the
    ``(N, K/tp)`` one; for act-order row-parallel the rank's ``qweight`` rows and ``g_idx[k0:k1]``
    with the *whole* scales and zeros; ``"hqq"``: the shard quantized by hqq (``shape`` its
    ``(N, K)``). ``bias``: column-parallel the slice, row-parallel the whole bias (kept on rank 0).
    Moved to ``device`` when given."""
    check_tp_rank(tp_rank, tp_size)
    check_sources(qweight, scales, zeros, format, bits, group_size)
    qweight, scales, zeros, g_idx, bias = (_to(_read(t), device) for t in (qweight, scales, zeros, g_idx, bias))
    if format == "hqq":
        qweight, scales, zeros = unpack(qweight, scales, zeros, format="hqq", bits=bits, group_size=group_size,
                                        shape=shape)
        format, zero_mode, shape = "plain", "float", None
    act_order = g_idx is not None
    n, ks = checkpoint_dims(qweight, scales, format, bits)
    full = (n * tp_size, ks) if style == "column" else (n, ks * tp_size)
    check_shardable(*full, style=style, tp_size=tp_size, format=format, bits=bits, group_size=group_size,
                    act_order=act_order, has_zeros=zeros is not None)
    if style == "row" and tp_rank != 0:
        bias = None
    common = dict(style=style, tp_rank=tp_rank, tp_size=tp_size, n=n, k=ks, bias=bias, bits=bits)
    if act_order and style == "row":
        if zero_mode != "int":
            raise ValueError(f"zero_mode: an act-order row-parallel shard is padded with zero weights (the zero "
                             f"code), which needs integer zero points; got zero_mode={zero_mode!r}")
        q, s, z = _act_order_canonical(qweight, scales, zeros, format, bits)
        check_g_idx(g_idx, q.shape[1], s.shape[1], q.device)  # (regroup counts members per group)
        q, s, z, g2, index = regroup(q, s, z, g_idx, group_size=group_size, bits=bits)
        return Shard(q, s, z, format="plain", group_size=g2, input_index=index, **common)
    return Shard(qweight, scales, zeros, format=format, group_size=group_size, g_idx=g_idx, zero_mode=zero_mode,
                 **common)


def _cut(qweight, scales, zeros, g_idx, bias, fmt, bits, style, lo, hi, group_size):
    """This rank's slices of the full tensors (module docstring's tables)."""
    p = 32 // bits
    if style == "column":
        b = None if bias is None else bias[lo:hi]
        if fmt in ("awq", "gptq", "gptq_v2"):  # qzeros pack P columns per int32 in all three
            cols = slice(lo // p, hi // p) if fmt == "awq" else slice(lo, hi)
            z = None if zeros is None else zeros[:, lo // p:hi // p]
            return qweight[:, cols], scales[:, lo:hi], z, g_idx, b
        z = None if zeros is None else zeros[lo:hi]
        return qweight[lo:hi], scales[lo:hi], z, g_idx, b
    act_order = g_idx is not None
    g0, g1 = (0, None) if group_size == -1 or act_order else (lo // group_size, hi // group_size)
    gi = None if g_idx is None else g_idx[lo:hi]
    if fmt in ("awq", "gptq", "gptq_v2"):
        rows = slice(lo, hi) if fmt == "awq" else slice(lo // p, hi // p)
        z = None if zeros is None else zeros[g0:g1]
        return qweight[rows], scales[g0:g1], z, gi, bias
    cols = slice(lo // 2, hi // 2) if fmt == "sparse12" else slice(lo, hi)
    z = None if zeros is None else zeros[:, g0:g1]
    return qweight[:, cols], scales[:, g0:g1], z, gi, bias


def shard_checkpoint(qweight, scales, zeros=None, *, style: str, tp_rank: int, tp_size: int, format: str,
                     bits: int = 4, group_size: int = 128, g_idx=None, zero_mode: str = "int", shape=None,
                     bias=None, device=None) -> Shard:
    """Rank ``tp_rank``'s :class:`Shard` of a full checkpoint tensor set (module docstring for the
    rules and cuts). The rules are checked on the shapes first; then only this rank's slices are
    read (tensors or safetensors slices) and moved to ``device`` (``"hqq"``: read whole and
    unpacked where the tensors are, then cut)."""
    check_tp_rank(tp_rank, tp_size)
    check_sources(qweight, scales, zeros, format, bits, group_size)
    if format == "hqq":  # read whole (rows interleave over all of W_q), cut from the canonical form
        if shape is not None:
            check_shardable(*shape, style=style, tp_size=tp_size, format="plain", bits=bits, group_size=group_size)
        qweight, scales, zeros = unpack(_read(qweight), _read(scales), _read(zeros), format="hqq", bits=bits,
                                        group_size=group_size, shape=shape)
        format, zero_mode = "plain", "float"
    n, k = checkpoint_dims(qweight, scales, format, bits)
    ns, ks = check_shardable(n, k, style=style, tp_size=tp_size, format=format, bits=bits, group_size=group_size,
                             act_order=g_idx is not None, has_zeros=zeros is not None)
    lo = tp_rank * (ns if style == "column" else ks)
    hi = lo + (ns if style == "column" else ks)
    parts = _cut(qweight, scales, zeros, g_idx, bias, format, bits, style, lo, hi, group_size)
    return rank_shard(*parts[:3], style=style, tp_rank=tp_rank, tp_size=tp_size, format=format, bits=bits,
                      group_size=group_size, g_idx=parts[3], zero_mode=zero_mode, bias=parts[4], device=device)


# ------------------------------------------------------------------ layers
def shard_linear(qweight, scales, zeros=None, bias=None, *, style: str, tp_rank: int, tp_size: int, format: str,
                 bits: int = 4, group_size: int = 128, g_idx=None, zero_mode: str = "int", shape=None,
                 dtype: Optional[torch.dtype] = None, device=None, layout: str = "auto", sliced: bool = False,
                 group=None, all_reduce: Optional[str] = None):
    """This rank's layer: a :class:`~mixed_gemm.nn.parallel.ColumnParallelQuantLinear` or a
    :class:`~mixed_gemm.nn.parallel.RowParallelQuantLinear` (all-reducing over ``group``), from
    the full checkpoint tensors (``sliced=False``: :func:`shard_checkpoint`) or from this rank's
    slices (``sliced=True``: :func:`rank_shard`). ``dtype``: the activation dtype (default: the
    scales' when 16-bit, else float16). ``all_reduce``: the row-parallel layer's all-reduce mode
    (:func:`~mixed_gemm.nn.parallel.tensor_parallel_all_reduce`)."""
    cut = rank_shard if sliced else shard_checkpoint
    shard = cut(qweight, scales, zeros, style=style, tp_rank=tp_rank, tp_size=tp_size, format=format, bits=bits,
                group_size=group_size, g_idx=g_idx, zero_mode=zero_mode, shape=shape, bias=bias, device=device)
    if dtype is None:
        dtype = shard.scales.dtype if shard.scales.dtype in (torch.float16, torch.bfloat16) else torch.float16
    return shard_to_module(shard, dtype=dtype, layout=layout, group=group, all_reduce=all_reduce)


def shard_to_module(shard: Shard, *, dtype: torch.dtype = torch.float16, layout: str = "auto", group=None,
                    all_reduce: Optional[str] = None):
    """Prepack ``shard`` and wrap it in its parallel layer (see :func:`shard_linear`)."""
    w = shard.prepack(dtype=dtype, layout=layout)
    nominal = -1 if shard.group_size == -1 else None
    if shard.style == "column":
        return ColumnParallelQuantLinear.from_shard(w, shard.bias, tp_rank=shard.tp_rank, tp_size=shard.tp_size,
                                                    format=shard.format, group_size=nominal)
    linear = QuantLinear.from_packed(w, shard.bias, format=shard.format, group_size=nominal)
    return RowParallelQuantLinear(linear, tp_rank=shard.tp_rank, tp_size=shard.tp_size, in_features=shard.k,
                                  input_index=shard.input_index, group=group, all_reduce=all_reduce)
