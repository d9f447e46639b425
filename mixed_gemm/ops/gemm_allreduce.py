"""The row-parallel GEMM fused with its all-reduce: ``sum over the group of (x_r @ W_r.T (+ bias)
(+ residual))`` as one gemv kernel per rank (:mod:`mixed_gemm.kernels.allreduce.gemv`), where it
applies; GEMM (:func:`mixed_gemm.matmul`) then the all-reduce (:mod:`.allreduce`) elsewhere.

Whether a call runs fused is decided from sizes and the weight's kind only
(:func:`mixed_gemm.kernels.allreduce.choose_gemm_fused`: mode ``"fused"``, M within the gemv
kernels' rows, N, the buffers' size), plus two verdicts every rank of the group reached together:
the communicator's (peer access, same GPU generation) and, per problem (weight kind, N, K, M
bucket), whether every rank loaded its fused kernel (agreed at the first eager call of that
problem, which every rank makes at the same point, as the layers run in the same order). So ranks
never disagree: a rank running the fused kernel while its peer runs GEMM + one-shot would wait
forever. A CUDA-graph capture that meets a problem no eager call prepared runs GEMM + all-reduce,
on every rank alike.

Which gemv configuration a rank runs is its own choice: what selection picked for the unfused GEMM,
so the result is the unfused path's bit for bit (the kernels pair ranks by chunks of outputs, not by
CTA tiles). Where selection picks another family (a tile at 16-32 rows), the problem runs GEMM +
all-reduce: a gemv in its place measured 2x slower than the tile + one-shot.

``torch.ops.mixed_gemm.gemm_all_reduce`` is the call as a custom op (fake implementation for
Dynamo). Design and expected numbers: docs/notes/tensor-parallel-allreduce.md.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from ..kernels.allreduce import NCCL, choose_gemm_fused
from ..kernels.allreduce.gemv import FAMILY, GemvAllReduceConfig, gemv_config_for
from ..kernels.base import sm_count
from ..runtime import current_stream
from ..select import m_bucket, selected
from .allreduce import Communicator, _capturing, _gather, _GROUPS, _why, all_reduce_mode, communicator
from .library import packed_view
from .matmul import _check_bias, _check_residual, _check_x, matmul, problem
from .packed import PackedWeight


def _key(w: PackedWeight, bucket: int) -> tuple:
    """What the fused kernel of a problem depends on, the same on every rank (sizes and kind)."""
    return (w.kernel_dtype, w.bits, w.zero_mode, w.group_size, w.layout, w.n, w.k, bucket)


def fused_plan(comm: Optional[Communicator], w: PackedWeight, m: int, mode: str) -> Tuple[object, str]:
    """``(launcher, reason)``: the fused kernel for ``m`` rows times ``w`` over ``comm``'s group,
    or ``(None, why not)``. Collective on the first eager call of a problem (see the module
    docstring); a dict lookup afterwards."""
    if comm is None or not comm.usable:
        return None, comm.reason if comm is not None else "no communicator (CPU or NCCL mode)"
    if not comm.same_arch:
        return None, "the group's GPUs differ in compute capability (weight layouts may differ)"
    ok, why = choose_gemm_fused(m, w.n, comm.world_size, w.kernel_dtype, w.layout, w.bits, mode, comm.slot_bytes)
    if not ok:
        return None, why
    key = _key(w, m_bucket(m))
    if key not in comm.gemm_fused:
        if _capturing():
            return None, "the fused kernel of this problem was not prepared before CUDA-graph capture (an eager call)"
        _prepare(comm, w, key)
    launcher = comm.gemm_fused[key]
    return (launcher, why) if launcher is not None else (None, comm.gemm_fused.get(("why",) + key, ""))


def _prepare(comm: Communicator, w: PackedWeight, key: tuple) -> None:
    """Load this rank's fused kernel for the problem ``key``, then agree with every rank."""
    bucket, index = key[-1], w.device.index
    launcher, why = None, ""
    try:
        prob = problem(w, bucket)
        choice = selected(w.signature, bucket, prob, index)
        if choice.family.name != "gemv":
            # Measured on two H100s (docs/notes/tensor-parallel-allreduce.md): at 16 rows the gemv
            # carrying the all-reduce took 2x the selected tile + one-shot.
            raise ValueError(f"selection runs the {choice.family.name} family at M={bucket}; only a gemv "
                             "GEMM carries the all-reduce without losing to the selected kernel")
        gemv = gemv_config_for(prob, sm_count(index), choice.config)
        if gemv is None:
            raise ValueError(f"no gemv kernel reads this {w.layout} weight at M={bucket}")
        launcher = FAMILY.launcher(GemvAllReduceConfig(gemv, comm.world_size), index)
    except Exception as e:  # noqa: BLE001 - e.g. no nvcc and no cached binary: GEMM + all-reduce on every rank
        launcher, why = None, _why(e)
    with torch.cuda.device(comm.device):
        results = _gather(why, comm.group)
    if any(results):
        launcher = None
        comm.gemm_fused[("why",) + key] = "fused kernel: " + "; ".join(f"rank {r}: {w_}" for r, w_ in
                                                                      enumerate(results) if w_)
    comm.gemm_fused[key] = launcher


def gemm_all_reduce(x: torch.Tensor, w: PackedWeight, bias: Optional[torch.Tensor] = None,
                    residual: Optional[torch.Tensor] = None, *, group=None, mode: Optional[str] = None) -> torch.Tensor:
    """``sum over group of (x @ W.T + bias + residual)``, each rank's term rounded to the dtype as
    :func:`mixed_gemm.matmul` rounds it, summed in rank order in fp32 and rounded once (the
    one-shot all-reduce's result). ``x``, ``bias``, ``residual``: :func:`mixed_gemm.matmul`'s
    rules (a row-parallel layer passes bias and residual on rank 0 only). ``mode``:
    :data:`mixed_gemm.kernels.allreduce.MODES` (default ``$MIXED_GEMM_ALLREDUCE``); only
    ``"fused"`` fuses, any other runs GEMM + that all-reduce."""
    mode = all_reduce_mode(mode)
    comm = communicator(group, w.device) if mode != NCCL and w.device.type == "cuda" else None
    launcher = None
    if comm is not None and isinstance(x, torch.Tensor) and isinstance(w, PackedWeight) and w.k and x.dim() >= 1:
        launcher, _ = fused_plan(comm, w, x.numel() // w.k if x.shape[-1] == w.k else 0, mode)
    if launcher is None:
        y = matmul(x, w, bias=bias, residual=residual)
        if comm is None:
            dist.all_reduce(y, group=group)
            return y
        return comm.all_reduce_(y, mode)
    _check_x(x, w)
    shape = (*x.shape[:-1], w.n)
    if bias is not None:
        _check_bias(bias, w)
    if residual is not None:
        _check_residual(residual, w, shape)
    y = x.new_empty(shape)
    if w.perm is not None:  # act-order: K of the weight was reordered once at prepack
        x = x.index_select(-1, w.perm)
    launcher(x, w, bias, y, x.numel() // w.k, current_stream(w.device.index), residual, comm)
    return y


# ---- the custom op (compiled models) ----
@torch.library.custom_op("mixed_gemm::gemm_all_reduce", mutates_args=())
def gemm_all_reduce_op(x: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                       perm: Optional[torch.Tensor], bias: Optional[torch.Tensor], n: int, k: int, bits: int,
                       group_size: int, zero_mode: str, layout: str, aux: List[torch.Tensor],
                       residual: Optional[torch.Tensor], group: str, mode: str) -> torch.Tensor:
    """:func:`gemm_all_reduce` for the PackedWeight with these tensors and fields (as
    ``mixed_gemm::matmul`` takes them) over the process group named ``group``."""
    w = packed_view(b, scales, zeros, perm, n, k, bits, group_size, zero_mode, layout, aux)
    pg = _GROUPS.get(group) or dist.distributed_c10d._resolve_process_group(group)
    x = x if x.is_contiguous() else x.contiguous()
    if residual is not None and not residual.is_contiguous():
        residual = residual.contiguous()
    return gemm_all_reduce(x, w, bias, residual, group=pg, mode=mode)


@gemm_all_reduce_op.register_fake
def _gemm_all_reduce_fake(x, b, scales, zeros, perm, bias, n, k, bits, group_size, zero_mode, layout, aux, residual,
                          group, mode):
    torch._check(x.shape[-1] == k, lambda: f"x: last dimension must equal the weight's K={k}")
    return x.new_empty((*x.shape[:-1], n))


__all__ = ["fused_plan", "gemm_all_reduce"]
