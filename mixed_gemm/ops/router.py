"""``topk_router``: a mixture-of-experts router, ``logits = x W^T``, softmax over the experts in
fp32, the ``top_k`` most probable, optionally renormalized to sum to one, then scaled. One launch
on the GPU (the ``router`` family, templates/router/router.cuh) for up to
:data:`~mixed_gemm.kernels.router.MAX_TOKENS` tokens; torch ops otherwise (the CPU, more tokens, a
kernel that cannot be loaded with compiling switched off, or one still compiling in the background
with ``$MIXED_GEMM_JIT`` async), with the same definition.

Contract (``T`` tokens, ``H`` hidden, ``E`` experts):

- ``x`` fp16/bf16 ``(T, H)`` contiguous (fp32 too, always in torch ops); ``weight`` ``(E, H)``
  contiguous, of x's dtype or fp32 (x is then widened, as DeepSeek's router does); same device.
- ``logits_dtype``: x's dtype (the logits rounded as ``F.linear(x, weight)`` rounds them, Qwen3 and
  Mixtral) or fp32 (DeepSeek's fp32 linear); the softmax reads the rounded logits.
- Returns ``(logits (T, E) logits_dtype, scores (T, top_k) scores_dtype, ids (T, top_k) int64)``,
  experts in descending probability (ties: the lower id), as ``torch.topk(..., sorted=True)``.
- ``counters``: int32, at least ``kernels.router.COUNTERS`` elements, zero (the kernel leaves them
  zero): the arrival counters of its token tiles. Calls that may overlap (other streams) need their
  own; the default is one buffer per device.

The kernel's logits may differ from cuBLAS's in the last bit (another summation order); the
selection is exact for the logits it returns.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..compile import background, jit_mode
from ..kernels.router import (COUNTERS, FAMILY, MAX_TOKENS, TORCH_DTYPES, RouterLauncher, RouterProblem, choose)
from ..runtime import current_stream

_LAUNCHERS: Dict[tuple, Optional[RouterLauncher]] = {}  # (config, device) -> launcher, None: not loadable
_BY_PROBLEM: Dict[tuple, Optional[RouterLauncher]] = {}  # (problem, device) -> its launcher: one lookup a call
WHY_NOT: Dict[tuple, str] = {}  # (config, device) -> why the kernel could not be loaded
_PENDING: Dict[tuple, Future] = {}  # (config, device) -> its background build (async JIT)
_COUNTERS: Dict[int, torch.Tensor] = {}  # device index -> the default arrival counters


_NAMES = {getattr(torch, k): v for k, v in TORCH_DTYPES.items()}  # torch dtype -> "f16" | "bf16" | "f32"


def _dtype_name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, "")


def check_router_args(x, weight, top_k, logits_dtype, scores_dtype, counters) -> None:
    """The contract's rules (module docstring), raising ValueError / TypeError naming the argument."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x: expected a float16, bfloat16 or float32 (tokens, hidden) tensor, got {x.dtype} "
                         f"{tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"weight: expected an (experts, {x.shape[1]}) tensor of {x.dtype} or float32, got "
                         f"{weight.dtype} {tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"weight: must be on x's device {x.device}, got {weight.device}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= weight.shape[0]:
        raise ValueError(f"top_k: expected an int in [1, {weight.shape[0]}] (the experts), got {top_k!r}")
    if logits_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"logits_dtype: must be x's dtype {x.dtype} or torch.float32, got {logits_dtype}")
    if scores_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"scores_dtype: must be torch.float16, torch.bfloat16 or torch.float32, got {scores_dtype}")
    if counters is not None and (not isinstance(counters, torch.Tensor) or counters.dtype != torch.int32
                                 or counters.numel() < COUNTERS or counters.device != x.device):
        raise ValueError(f"counters: expected an int32 tensor of at least {COUNTERS} elements on {x.device}")


def router_reference(x: torch.Tensor, weight: torch.Tensor, top_k: int, *, renormalize: bool, scale: float = 1.0,
                     logits_dtype: Optional[torch.dtype] = None,
                     scores_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router in torch ops (the definition the kernel follows; any device)."""
    logits_dtype = x.dtype if logits_dtype is None else logits_dtype
    scores_dtype = logits_dtype if scores_dtype is None else scores_dtype
    if logits_dtype == torch.float32:
        logits = F.linear(x.float(), weight.float())
    else:
        logits = F.linear(x, weight.to(x.dtype))
    # softmax's dtype casts its input first: the same values as .float() without a launch of its
    # own (this path serves eager prefills, whose time is host time per launch)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    values, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        values /= values.sum(dim=-1, keepdim=True)
    if scale != 1.0:
        values *= scale
    return logits, values.to(scores_dtype), ids


def _launcher(problem: RouterProblem, device: int) -> Optional[RouterLauncher]:
    """The launcher for ``problem`` on ``device``, or None while torch ops serve it: the kernel
    cannot implement it or cannot be loaded (``WHY_NOT`` says why), or, with ``$MIXED_GEMM_JIT``
    async (the default), it is compiling in the background (as ``matmul``'s stand-ins: a call never
    waits for nvcc; a later call takes the kernel once built)."""
    found = _BY_PROBLEM.get((problem, device), False)
    if found is not False:
        return found
    config = choose(problem.x, problem.w, problem.logits, problem.scores, problem.tokens, problem.hidden,
                    problem.experts)
    key = (config, device)
    if key not in _LAUNCHERS:
        ok, why = FAMILY.supports(device)
        if ok:
            ok, why = FAMILY.can_implement(config, problem)
        if ok and not _built(config, key):
            return None  # compiling in the background: torch ops meanwhile, nothing cached
        launcher = None
        if ok:
            try:
                launcher = FAMILY.launcher(config, device)
            except Exception as e:  # noqa: BLE001 - no nvcc with compiling off, a build error: torch serves
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if launcher is None:
            WHY_NOT[key] = why
        _LAUNCHERS[key] = launcher
    _BY_PROBLEM[(problem, device)] = _LAUNCHERS[key]
    return _LAUNCHERS[key]


def _built(config, key) -> bool:
    """Whether ``config``'s binary can be loaded now; with async JIT, a missing one is submitted to
    the background builds (once) and False returned until it is done (a failed build counts as
    done: loading then raises its error, which ``_launcher`` records)."""
    pending = _PENDING.get(key)
    if pending is None:
        if jit_mode() != "async" or FAMILY.ready(config):
            return True
        pending = _PENDING[key] = background.submit(FAMILY.build_spec(config))
    return pending.done()


def _default_counters(device: int) -> torch.Tensor:
    buf = _COUNTERS.get(device)
    if buf is None:
        buf = _COUNTERS[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=f"cuda:{device}")
    return buf


def kernel_problem(x: torch.Tensor, weight: torch.Tensor, top_k: int, logits_dtype: torch.dtype,
                   scores_dtype: torch.dtype) -> Optional[RouterProblem]:
    """The kernel's problem for a call, or None where the call goes to torch ops (not a CUDA tensor,
    more than MAX_TOKENS tokens, no tokens, not 16-byte aligned)."""
    tokens = x.shape[0]
    if not x.is_cuda or x.dtype == torch.float32 or not 1 <= tokens <= MAX_TOKENS or not x.is_contiguous() or not weight.is_contiguous():
        return None
    if x.data_ptr() % 16 or weight.data_ptr() % 16:
        return None
    return RouterProblem(tokens=tokens, experts=weight.shape[0], hidden=x.shape[1], top_k=top_k,
                         x=_dtype_name(x.dtype), w=_dtype_name(weight.dtype), logits=_dtype_name(logits_dtype),
                         scores=_dtype_name(scores_dtype))


def topk_router(x: torch.Tensor, weight: torch.Tensor, top_k: int, *, renormalize: bool = True, scale: float = 1.0,
                logits_dtype: Optional[torch.dtype] = None, scores_dtype: Optional[torch.dtype] = None,
                counters: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits, scores, ids)`` of the router (module docstring)."""
    logits_dtype = x.dtype if logits_dtype is None else logits_dtype
    scores_dtype = logits_dtype if scores_dtype is None else scores_dtype
    check_router_args(x, weight, top_k, logits_dtype, scores_dtype, counters)
    problem = kernel_problem(x, weight, top_k, logits_dtype, scores_dtype)
    device = x.device.index if x.is_cuda else -1
    launcher = _launcher(problem, device) if problem is not None else None
    if launcher is None:
        return router_reference(x, weight, top_k, renormalize=renormalize, scale=scale, logits_dtype=logits_dtype,
                                scores_dtype=scores_dtype)
    return launch_router(launcher, x, weight, top_k, renormalize, scale, logits_dtype, scores_dtype,
                         _default_counters(device) if counters is None else counters)


def launch_router(launcher: RouterLauncher, x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool,
                  scale: float, logits_dtype: torch.dtype, scores_dtype: torch.dtype,
                  counters: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch of ``launcher``'s kernel on torch's current stream (arguments already checked
    against the contract and its ``can_implement``): ``(logits, scores, ids)``."""
    (tokens, hidden), experts = x.shape, weight.shape[0]
    logits = torch.empty((tokens, experts), dtype=logits_dtype, device=x.device)
    scores = torch.empty((tokens, top_k), dtype=scores_dtype, device=x.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=x.device)
    with launcher.fn.lock:
        a = launcher.args
        a.x, a.weight, a.logits, a.scores = x.data_ptr(), weight.data_ptr(), logits.data_ptr(), scores.data_ptr()
        a.ids, a.counters = ids.data_ptr(), counters.data_ptr()
        a.tokens, a.experts, a.hidden, a.top_k = tokens, experts, hidden, top_k
        a.renormalize, a.scale = int(bool(renormalize)), float(scale)
        launcher.launch(tokens, experts, hidden, current_stream(x.device.index))
    return logits, scores, ids
