"""``silu_mul_matmul``: an MLP's gate|up projection with SiLU(gate) * up in the epilogue.

``w`` is a fused gate|up :class:`PackedWeight` of ``(2I, K)``: rows ``[0, I)`` are the gate
projection's, rows ``[I, 2I)`` the up projection's (``integrations.fuse.fuse_projections`` builds
it so). The result is ``h (M, I) = silu(x @ Wg.T) * (x @ Wu.T)``, computed from fp32 sums and
rounded once to x's dtype: half the output bytes of the plain product, and no SiLU and multiply
kernels after it.

At decode sizes (``M <= GATED_MAX_ROWS``) on a GPU where the ``moe_gemv`` family runs, the weight
is read as one expert of a grouped gate|up stage (``E = 1``, every row routed to it): the sm90a
layout of a dense weight *is* the stacked experts' layout with one expert, so the tensors are
viewed, never copied. Otherwise (more rows, another layout, symmetric weights without zeros, the
CPU) it is ``matmul`` then SiLU·mul in torch, the same numbers up to rounding.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

from ..compile import JitDisabledError, blocking
from ..kernels import GROUPED_FAMILIES, MoeProblem
from ..kernels.base import sm_count
from ..runtime import current_stream
from ..select import m_bucket
from .experts import PackedExperts
from .matmul import matmul
from .packed import KERNEL_DTYPES, PackedWeight

# Measured on the H100 (bench/bench_epilogues.py --gated, docs/notes/moe.md): with moe_gemv's untuned gate|up
# schedules the fused op is 0.77-0.85x of gemv + SiLU·mul at 1-4 rows and 0.54x at 8-16 (the
# 16-row expert chunks), so it stops at 4 rows and fuse_projections leaves it off by default.
GATED_MAX_ROWS = 4

# (weight signature, M bucket) -> (launcher, config) or None (the fallback runs)
_PLANS: Dict[Tuple, Optional[tuple]] = {}
_IDS: Dict[int, torch.Tensor] = {}  # device -> zeros (GATED_MAX_ROWS, 1) int32: every row routed to expert 0
_LOCK = threading.Lock()


def _check(x: torch.Tensor, w: PackedWeight) -> None:
    if not isinstance(w, PackedWeight):
        raise TypeError(f"w: expected a PackedWeight (mixed_gemm.prepack), got {type(w).__name__}")
    if w.n % 2:
        raise ValueError(f"w: a gate|up weight has 2I rows (gate then up), got N={w.n}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.device != w.device:  # (the grouped path launches on x's device with w's tensors)
        raise ValueError(f"x: must be on the weight's device {w.device}, got {x.device}")
    if x.dim() < 1 or x.shape[-1] != w.k:
        raise ValueError(f"x: last dimension must equal the weight's K={w.k}, got shape {tuple(x.shape)}")
    if x.dtype != w.dtype:
        raise TypeError(f"x: expected dtype {w.dtype} (the dtype the weight was prepacked for), got {x.dtype}")


def _as_expert(w: PackedWeight) -> Optional[PackedExperts]:
    """``w`` as one stacked expert (views), or None when the grouped kernel cannot read it."""
    if w.layout != "sm90a" or w.zeros is None or w.perm is not None or w.b.shape[1] != -(-w.n // 16):
        return None  # (the grouped kernel reads exactly N/16 strips: no padded rows)
    if not all(t.is_contiguous() for t in (w.b, w.scales, w.zeros)):
        return None
    return PackedExperts(b=w.b.unsqueeze(0), scales=w.scales.unsqueeze(0), zeros=w.zeros.unsqueeze(0), n=w.n,
                         k=w.k, bits=w.bits, group_size=w.group_size, zero_mode=w.zero_mode, layout=w.layout)


def _plan(w: PackedWeight, rows: int, device_index: int):
    key = (w.signature, m_bucket(rows))
    if key in _PLANS:
        return _PLANS[key]
    plan = None
    problem = MoeProblem(tokens=m_bucket(rows), top_k=1, experts=1, n=w.n, k=w.k, dtype=KERNEL_DTYPES[w.dtype],
                         bits=w.bits, zero_mode=w.zero_mode, group_size=w.group_size, layout=w.layout, stage="w13")
    for fam in GROUPED_FAMILIES:
        if not fam.supports(device_index)[0]:
            continue
        config = fam.heuristic(problem, sm_count(device_index))
        if config is not None and fam.can_implement(config, problem)[0]:
            try:
                with blocking():  # a first call compiles here if need be, as matmul's do
                    plan = (fam.launcher(config, device_index), config)
            except JitDisabledError:  # MIXED_GEMM_JIT=off and not packaged: the matmul path runs
                plan = None
            break
    with _LOCK:
        return _PLANS.setdefault(key, plan)


def _ids(device: torch.device, rows: int) -> torch.Tensor:
    """``rows`` zero expert ids (every row routed to the one expert), from a buffer kept per device."""
    ids = _IDS.get(device.index)
    if ids is None or ids.shape[0] < rows:  # (GATED_MAX_ROWS raised since: a longer buffer)
        with _LOCK:
            ids = _IDS[device.index] = torch.zeros((max(rows, GATED_MAX_ROWS), 1), dtype=torch.int32, device=device)
    return ids[:rows]


def silu_mul_matmul(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """``silu(x @ Wg.T) * (x @ Wu.T)`` for a gate|up weight ``w`` (module docstring: the contract);
    ``x`` ``(..., K)`` -> ``(..., I)`` in x's dtype."""
    _check(x, w)
    lead, inter = x.shape[:-1], w.n // 2
    rows = x.numel() // w.k if w.k else 0
    experts = _as_expert(w) if x.is_cuda and 0 < rows <= GATED_MAX_ROWS else None
    plan = _plan(w, rows, x.device.index) if experts is not None else None
    if not x.is_contiguous() or x.data_ptr() % 16:  # either path reads rows 16 bytes at a time
        x = x.clone(memory_format=torch.contiguous_format)
    if plan is None:
        gate, up = matmul(x, w).split(inter, dim=-1)
        return torch.nn.functional.silu(gate) * up
    launcher, _ = plan
    x2 = x.reshape(rows, w.k)
    h = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    launcher(x2, experts, _ids(x.device, rows), None, h, rows, 1, current_stream(x.device.index))
    return h.reshape(*lead, inter)


def gated_kernel(w: PackedWeight, rows: int, device_index: int = 0) -> Optional[str]:
    """The grouped schedule ``silu_mul_matmul`` runs for ``rows`` rows of ``w``, or None (fallback)."""
    if _as_expert(w) is None or not 0 < rows <= GATED_MAX_ROWS:
        return None
    plan = _plan(w, rows, device_index)
    return None if plan is None else plan[1].schedule
