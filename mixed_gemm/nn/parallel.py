"""Tensor-parallel quantized layers, named and split as in vLLM / SGLang (Megatron-style):

- :class:`ColumnParallelQuantLinear` (q/k/v, gate/up, a fused q|k|v or gate|up): rank ``r`` of
  ``tp_size`` holds output rows ``[r N/tp, (r+1) N/tp)`` of ``W`` ``(N, K)`` and every input column;
  its output is this rank's slice of ``y`` (``gather_output=False``): no communication.
- :class:`RowParallelQuantLinear` (o, down): rank ``r`` holds input columns ``[r K/tp, (r+1) K/tp)``
  and every output row; it takes this rank's slice of ``x`` (``input_is_parallel=True``: the column
  slice the preceding column-parallel layer produced) and all-reduces (sum) the partial products
  over the process group. A bias (and a residual handed to ``forward``) is added by rank 0 only,
  before the all-reduce, so it is counted once.

The all-reduce (:func:`tensor_parallel_all_reduce`): on GPUs of one node with peer access, our
one-shot / two-shot kernels for the small messages of decode (:mod:`mixed_gemm.ops.allreduce`),
NCCL beyond their sizes and elsewhere; gloo on the CPU. ``all_reduce="nccl"`` (or
``MIXED_GEMM_ALLREDUCE=nccl``) keeps NCCL for every size, for A/B comparisons.
``fuse_all_reduce=True`` on a row-parallel layer (or ``all_reduce="fused"``,
``MIXED_GEMM_ALLREDUCE=fused``) runs its GEMM and all-reduce as one gemv kernel at decode sizes
(:mod:`mixed_gemm.ops.gemm_allreduce`), GEMM + all-reduce elsewhere.
:func:`all_reduce_residual_rms_norm` is the all-reduce fused with the residual add and RMSNorm that
follow a decoder layer's row-parallel projections (``reduce_results=False`` hands it the partial sum).

How a checkpoint's tensors are cut into these shards (packing, groups, act-order, zeros):
:mod:`mixed_gemm.integrations.shard`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..ops import PackedWeight
from ..ops.allreduce import all_reduce_mode, communicator, group_name, prepare_all_reduce, residual_rms_norm
from ..ops.gemm_allreduce import gemm_all_reduce  # registers torch.ops.mixed_gemm.gemm_all_reduce
from .quant_linear import QuantLinear

__all__ = ["ColumnParallelQuantLinear", "RowParallelQuantLinear", "all_reduce_residual_rms_norm", "check_tp_rank",
           "prepare_all_reduce", "tensor_parallel_all_reduce"]


def tensor_parallel_all_reduce(y: torch.Tensor, group=None, mode: Optional[str] = None,
                               name: Optional[str] = None) -> torch.Tensor:
    """Sum ``y`` over the ranks of ``group`` (the default group when ``None``); returns the sum.
    ``mode``: ``"auto"`` (default: ``$MIXED_GEMM_ALLREDUCE``, else auto), ``"nccl"``, ``"one_shot"``
    or ``"two_shot"`` (:mod:`mixed_gemm.ops.allreduce`); ``name``: the group's name, if known.
    Eager: in place (ours or :func:`torch.distributed.all_reduce`; both capturable in a CUDA
    graph). Under ``torch.compile``: the custom op ``torch.ops.mixed_gemm.all_reduce``, or with
    ``"nccl"`` (and on the CPU) the functional collective, which Dynamo traces."""
    mode = all_reduce_mode(mode)
    if torch.compiler.is_compiling():
        if mode == "nccl" or not y.is_cuda:
            from torch.distributed import _functional_collectives as funcol

            return funcol.all_reduce(y, "sum", group if group is not None else dist.group.WORLD)
        return torch.ops.mixed_gemm.all_reduce(y, name if name is not None else group_name(group), mode)
    if mode == "nccl" or not y.is_cuda:
        dist.all_reduce(y, group=group)
        return y
    return communicator(group, y.device).all_reduce_(y, mode)


def all_reduce_residual_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                 group=None, mode: Optional[str] = None, tp_size: Optional[int] = None,
                                 name: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(weight * rms_norm(h), h)`` with ``h = residual + sum(x)``, ``x`` a row-parallel layer's
    partial sum (``reduce_results=False``) and ``sum`` over ``group``: the all-reduce, skip
    connection and next RMSNorm of a pre-norm decoder layer, in one kernel where ours serves the
    size (else the all-reduce, then torch's ops; transformers' LlamaRMSNorm steps, fp32
    statistics). ``tp_size=1`` (or no initialized process group): no communication."""
    if tp_size == 1 or (tp_size is None and not (dist.is_available() and dist.is_initialized())):
        return residual_rms_norm(x, residual, weight, eps)
    mode = all_reduce_mode(mode)
    if torch.compiler.is_compiling():
        if mode == "nccl" or not x.is_cuda:
            return residual_rms_norm(tensor_parallel_all_reduce(x, group, mode, name), residual, weight, eps)
        return torch.ops.mixed_gemm.all_reduce_residual_rms_norm(
            x, residual, weight, eps, name if name is not None else group_name(group), mode)
    if mode == "nccl" or not x.is_cuda:
        return residual_rms_norm(tensor_parallel_all_reduce(x.clone(), group, mode), residual, weight, eps)
    return communicator(group, x.device).all_reduce_residual_rms_norm(x, residual, weight, eps, mode)


def check_tp_rank(tp_rank, tp_size) -> None:
    """``tp_size >= 1`` and ``0 <= tp_rank < tp_size`` (ints)."""
    for name, v in (("tp_rank", tp_rank), ("tp_size", tp_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank, tp_size: expected tp_size >= 1 and 0 <= tp_rank < tp_size, got {tp_rank}, {tp_size}")


class ColumnParallelQuantLinear(QuantLinear):
    """A :class:`QuantLinear` over output rows ``[tp_rank N/tp, (tp_rank+1) N/tp)`` of a weight
    whose full output size is ``full_out_features`` (``out_features`` is the shard's). Forward is
    QuantLinear's (no communication), so ``fuse_projections`` concatenates shards of one rank
    (q_r | k_r | v_r) exactly as servers' QKVParallelLinear holds them."""

    tp_rank: int = 0
    tp_size: int = 1

    @classmethod
    def from_shard(cls, w: PackedWeight, bias: Optional[torch.Tensor] = None, *, tp_rank: int, tp_size: int,
                   format: str = "plain", group_size: Optional[int] = None) -> "ColumnParallelQuantLinear":
        """This rank's shard ``w`` (``(N/tp, K)``) and bias slice as a layer (tensors shared)."""
        check_tp_rank(tp_rank, tp_size)
        mod = cls.from_packed(w, bias, format=format, group_size=group_size)
        mod.tp_rank, mod.tp_size = tp_rank, tp_size
        return mod

    @property
    def full_out_features(self) -> int:
        return self.out_features * self.tp_size

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, tp_rank={self.tp_rank}, tp_size={self.tp_size}"


class RowParallelQuantLinear(nn.Module):
    """``y = all_reduce(x_r @ W_r.T) (+ bias)``: ``linear`` holds this rank's input columns.

    ``input_index`` (optional, int64 ``(K'',)``): the columns of this rank's ``x`` slice the
    weight reads, in the weight's order (a GPTQ act-order shard regrouped so its groups are
    contiguous; see :func:`mixed_gemm.integrations.shard.regroup`). ``linear.in_features`` is then
    ``K''``, and ``in_features`` is the slice's width ``K/tp``.
    ``input_is_parallel=False`` takes the full ``x`` and keeps this rank's columns itself.
    ``reduce_results=False`` returns the partial sum (a caller that fuses the all-reduce:
    :func:`all_reduce_residual_rms_norm`). ``all_reduce``: the all-reduce's mode
    (:func:`tensor_parallel_all_reduce`; default ``$MIXED_GEMM_ALLREDUCE``, else ``"auto"``),
    read once here; the attribute ``all_reduce`` can be changed afterwards.
    ``fuse_all_reduce``: the GEMM and the all-reduce as one kernel where the sizes allow
    (:mod:`mixed_gemm.ops.gemm_allreduce`: gemv rows of x, on GPUs of one node), else GEMM +
    all-reduce; default: ``all_reduce == "fused"``. An attribute too.
    """

    def __init__(self, linear: QuantLinear, *, tp_rank: int, tp_size: int, in_features: Optional[int] = None,
                 input_index: Optional[torch.Tensor] = None, group=None, input_is_parallel: bool = True,
                 reduce_results: bool = True, all_reduce: Optional[str] = None,
                 fuse_all_reduce: Optional[bool] = None):
        super().__init__()
        check_tp_rank(tp_rank, tp_size)
        self.all_reduce = all_reduce_mode(all_reduce)
        if fuse_all_reduce is not None and not isinstance(fuse_all_reduce, bool):
            raise TypeError(f"fuse_all_reduce: expected a bool or None, got {type(fuse_all_reduce).__name__}")
        self.fuse_all_reduce = self.all_reduce == "fused" if fuse_all_reduce is None else fuse_all_reduce
        if not isinstance(linear, QuantLinear):
            raise TypeError(f"linear: expected a QuantLinear, got {type(linear).__name__}")
        if linear.bias is not None and tp_rank != 0:
            raise ValueError("linear: only rank 0 of a row-parallel layer holds the bias (it is added once, "
                             "before the all-reduce)")
        in_features = linear.in_features if in_features is None else in_features
        if input_index is not None:
            if input_index.dim() != 1 or input_index.shape[0] != linear.in_features:
                raise ValueError(f"input_index: expected ({linear.in_features},) (linear.in_features), "
                                 f"got {tuple(input_index.shape)}")
            input_index = input_index.to(device=linear.b.device, dtype=torch.int64)
        elif in_features != linear.in_features:
            raise ValueError(f"in_features: {in_features} differs from linear.in_features={linear.in_features} "
                             "without an input_index")
        self.linear = linear
        self.register_buffer("input_index", input_index)
        self.in_features, self.out_features = in_features, linear.out_features
        self.tp_rank, self.tp_size, self.group = tp_rank, tp_size, group
        self.input_is_parallel, self.reduce_results = input_is_parallel, reduce_results
        # The group's name as a plain string: what the compiled path hands the custom op.
        self.group_name = group_name(group) if tp_size > 1 and dist.is_available() and dist.is_initialized() else None

    @property
    def full_in_features(self) -> int:
        return self.in_features * self.tp_size

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The all-reduced ``x_r @ W_r.T`` (+ bias) (+ ``residual``, the output's shape: a skip
        connection, added by rank 0 in the GEMM's epilogue, so once)."""
        if not self.input_is_parallel:
            k0 = self.tp_rank * self.in_features
            x = x[..., k0:k0 + self.in_features].contiguous()
        if self.input_index is not None:
            x = x.index_select(-1, self.input_index)
        residual = residual if self.tp_rank == 0 else None
        if self.fuse_all_reduce and self.reduce_results and self.tp_size > 1 and x.is_cuda:
            return self._fused(x, residual)
        y = self.linear(x, residual=residual)
        if self.reduce_results and self.tp_size > 1:
            if self.group_name is None and not torch.compiler.is_compiling():
                self.group_name = group_name(self.group)
            y = tensor_parallel_all_reduce(y, self.group, self.all_reduce, self.group_name)
        return y

    def _fused(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
        """The GEMM and the all-reduce in one kernel where :mod:`mixed_gemm.ops.gemm_allreduce`
        allows (mode ``"fused"``; ``"nccl"`` stays GEMM + NCCL)."""
        mode = "nccl" if self.all_reduce == "nccl" else "fused"
        lin = self.linear
        if residual is not None and not residual.is_contiguous():
            residual = residual.contiguous()
        if torch.compiler.is_compiling():  # traced: the op takes the buffers (QuantLinear.forward's)
            buf = lin._buffers
            g = lin.in_features if lin.group_size == -1 or buf["scales"].shape[0] == 1 else lin.group_size
            name = self.group_name if self.group_name is not None else group_name(self.group)
            return torch.ops.mixed_gemm.gemm_all_reduce(
                x, buf["b"], buf["scales"], buf["zeros"], buf["perm"], buf["bias"], lin.out_features,
                lin.in_features, lin.bits, g, lin.zero_mode, lin.layout, lin._aux(), residual, name, mode)
        return gemm_all_reduce(x if x.is_contiguous() else x.contiguous(), lin.packed(), bias=lin._buffers["bias"],
                               residual=residual, group=self.group, mode=mode)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (of {self.full_in_features}), out_features={self.out_features}, "
                f"tp_rank={self.tp_rank}, tp_size={self.tp_size}, regrouped={self.input_index is not None}, "
                f"all_reduce={self.all_reduce}, fuse_all_reduce={self.fuse_all_reduce}")
