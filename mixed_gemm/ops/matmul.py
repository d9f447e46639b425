"""``mixed_gemm.matmul``: y = x @ dequant(W).T (+ bias) (+ residual) on the GPU."""
from __future__ import annotations

from typing import Optional

import torch

from ..kernels import Problem
from ..runtime import current_stream
from ..select import SELECTED, Choice, forced, m_bucket, selected
from .packed import PackedWeight, prepack


def _fail(exc: type, msg: str):
    raise exc(msg)


try:  # the current device without torch.cuda.current_device()'s Python-side lazy-init checks
    _current_device = torch._C._cuda_getDevice
except AttributeError:  # pragma: no cover - a CPU-only torch
    _current_device = torch.cuda.current_device


def _check_x(x, w: PackedWeight) -> None:
    if not isinstance(x, torch.Tensor):
        _fail(TypeError, f"x: expected a torch.Tensor, got {type(x).__name__}")
    dev = x.device
    if dev != w.device:
        _fail(ValueError, f"x: must be on the weight's device {w.device}, got {dev}")
    if dev.type != "cuda":
        _fail(ValueError, f"x: must be a CUDA tensor (the kernels run on the GPU), got device {dev}")
    if x.dtype != w.dtype:
        _fail(TypeError, f"x: expected dtype {w.dtype} (the dtype the weight was prepacked for), got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != w.k:
        _fail(ValueError, f"x: last dimension must equal the weight's K={w.k}, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        _fail(ValueError, "x: must be contiguous (rows are copied 16 bytes at a time); call .contiguous()")
    if x.data_ptr() % 16:
        _fail(ValueError, "x: data pointer must be 16-byte aligned (cp.async copies 16 bytes)")


def _check_bias(bias, w: PackedWeight) -> None:
    if not isinstance(bias, torch.Tensor):
        _fail(TypeError, f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    if bias.device != w.device or bias.dtype != w.dtype or tuple(bias.shape) != (w.n,):
        _fail(ValueError, f"bias: expected a {w.dtype} ({w.n},) tensor on {w.device}, "
                          f"got {bias.dtype} {tuple(bias.shape)} on {bias.device}")
    if not bias.is_contiguous() or bias.data_ptr() % 16:
        _fail(ValueError, "bias: must be contiguous and 16-byte aligned (the sm90a epilogue loads it in 16-byte units)")


def _check_residual(residual, w: PackedWeight, shape: tuple) -> None:
    if not isinstance(residual, torch.Tensor):
        _fail(TypeError, f"residual: expected a torch.Tensor or None, got {type(residual).__name__}")
    if residual.device != w.device or residual.dtype != w.dtype or tuple(residual.shape) != shape:
        _fail(ValueError, f"residual: expected a {w.dtype} tensor of the output's shape {shape} on {w.device}, "
                          f"got {residual.dtype} {tuple(residual.shape)} on {residual.device}")
    if not residual.is_contiguous() or residual.data_ptr() % 16:
        _fail(ValueError, "residual: must be contiguous and 16-byte aligned (the epilogues read it like the output)")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _plain(t: torch.Tensor, dtype: torch.dtype, device_index: int) -> bool:
    """``t`` has ``dtype``, lives on GPU ``device_index``, is contiguous and 16-byte aligned: what the
    epilogues and loads of every family read. Cheap reads only (``get_device()`` is an int, -1 on
    the CPU); a False sends the caller to the check that names the broken rule."""
    return t.dtype is dtype and t.get_device() == device_index and t.is_contiguous() and not t.data_ptr() % 16


def matmul(
    x: torch.Tensor,
    w,
    scales: Optional[torch.Tensor] = None,
    zeros: Optional[torch.Tensor] = None,
    *,
    format: str = "awq",
    bits: int = 4,
    group_size: int = 128,
    bias: Optional[torch.Tensor] = None,
    config=None,
    out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``y = x @ W.T + bias + residual`` with ``W`` dequantized on the fly (``(q - z) s`` or ``q s + m``).

    Two forms:

    - ``matmul(x, w: PackedWeight, bias=None)``: the fast path; prepack once with :func:`prepack`.
    - ``matmul(x, qweight, scales, zeros, *, format="awq", bits=4, group_size=128, bias=None)``:
      prepacks on every call for ``x.dtype`` (convenience; see :func:`mixed_gemm.unpack`).

    ``x``: ``(..., K)`` in the weight's dtype (float16 or bfloat16), contiguous, 16-byte aligned, on
    the weight's CUDA device; any number of rows ``M >= 0``. Returns ``(..., N)`` in that dtype;
    fp32 accumulation. ``bias``: ``(N,)`` in that dtype, 16-byte aligned. ``out``: optional
    contiguous, 16-byte aligned result tensor (no allocation). ``residual``: optional ``(..., N)``
    tensor of the output's shape and dtype, contiguous, 16-byte aligned, not overlapping ``out``
    (a decoder block's skip connection): added in fp32 before the one rounding by the decode
    families' kernels (gemv, sm80), by one add after the others (sm90a, dequant_mm). Rules on
    ``N``/``K``/``group_size`` are those of :func:`prepack`.
    ``config`` forces a kernel configuration of any family (sweeps, debugging); its dtype, bits and
    zero mode must match the weight. Otherwise the kernel comes from ``$MIXED_GEMM_SCHEDULE``, the
    GPU's profile, else the families' heuristics (:func:`mixed_gemm.select.choose`), once per weight
    signature and power-of-two M bucket (:func:`explain` says which). Every rule is checked before
    anything is launched.
    """
    if not isinstance(w, PackedWeight):
        if not isinstance(w, torch.Tensor):
            _fail(TypeError, f"w: expected a PackedWeight or a qweight tensor, got {type(w).__name__}")
        if scales is None:
            _fail(ValueError, "scales: required when w is a raw qweight tensor")
        dtype = x.dtype if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else torch.float16
        w = prepack(w, scales, zeros, format=format, bits=bits, group_size=group_size, dtype=dtype)
    elif scales is not None or zeros is not None:
        _fail(ValueError, "scales/zeros: pass them to prepack(), not with a PackedWeight")
    k, n = w.k, w.n
    device_index = w.device.index
    # The common call passes one chain of cheap reads (no torch.device object: get_device() is an
    # int, -1 on the CPU); anything off goes through _check_x, which names the rule it breaks.
    xs = x.shape if isinstance(x, torch.Tensor) else None
    if not xs or xs[-1] != k or not _plain(x, w.dtype, device_index):
        _check_x(x, w)
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (n,)
                             or not _plain(bias, w.dtype, device_index)):
        _check_bias(bias, w)

    m = x.numel() // k
    shape = (*xs[:-1], n)
    if out is None:
        y = x.new_empty(shape)  # x has the weight's dtype and device (checked)
    else:
        if not isinstance(out, torch.Tensor) or out.device != x.device or out.dtype != w.dtype \
                or tuple(out.shape) != shape or not out.is_contiguous() or out.data_ptr() % 16:
            _fail(ValueError, f"out: expected a contiguous, 16-byte aligned {w.dtype} tensor of shape {shape} on "
                              f"{x.device} (TMA stores the sm90a kernels' output in 16-byte units)")
        y = out
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or residual.shape != shape or not _plain(residual, w.dtype,
                                                                                             device_index):
            _check_residual(residual, w, shape)
        if out is not None and _overlap(residual, y):
            _fail(ValueError, "residual: must not overlap out (families without the epilogue add it after the "
                              "GEMM has written out)")
    if m == 0:
        return y

    if config is None:
        bucket = 1 << (m - 1).bit_length()  # m_bucket(m), inlined: m >= 1 here
        choice = SELECTED.get((w.signature, bucket))
        if choice is None:
            choice = selected(w.signature, bucket, problem(w, bucket), device_index)
    else:
        choice = forced(config, problem(w, m), device_index)
    if w.perm is not None:  # act-order: K of the weight was reordered once at prepack
        x = x.index_select(-1, w.perm)
    if device_index != _current_device():
        with torch.cuda.device(device_index):  # the launch goes to the current context
            choice.launch(x, w, bias, y, m, current_stream(device_index), residual)
    else:
        choice.launch(x, w, bias, y, m, current_stream(device_index), residual)
    return y


def problem(w: PackedWeight, m: int) -> Problem:
    """The selection problem of ``m`` rows times ``w``."""
    return Problem(m=m, n=w.n, k=w.k, dtype=w.kernel_dtype, bits=w.bits, zero_mode=w.zero_mode,
                   group_size=w.group_size, layout=w.layout)


def explain(x_or_m, w: PackedWeight) -> Choice:
    """What :func:`matmul` runs for ``x`` (or ``m`` rows) times ``w`` on ``w``'s device: a
    :class:`~mixed_gemm.select.Choice` with ``family``, ``config``, ``schedule``
    (``"family:schedule"``) and ``source`` (``"override"``, ``"profile <file> M=<bucket>"`` or
    ``"heuristic"``). Chooses (and caches) as ``matmul`` would, without building or launching."""
    if not isinstance(w, PackedWeight):
        raise TypeError(f"w: expected a PackedWeight, got {type(w).__name__}")
    if isinstance(x_or_m, torch.Tensor):
        if x_or_m.dim() < 1 or x_or_m.shape[-1] != w.k:
            raise ValueError(f"x: last dimension must equal the weight's K={w.k}, got shape {tuple(x_or_m.shape)}")
        m = x_or_m.numel() // w.k
    elif isinstance(x_or_m, int) and not isinstance(x_or_m, bool) and x_or_m >= 1:
        m = x_or_m
    else:
        raise TypeError(f"x_or_m: expected a tensor or a number of rows >= 1, got {x_or_m!r}")
    if w.device.type != "cuda":
        raise ValueError(f"w: must be on a CUDA device (selection depends on the GPU), got {w.device}")
    bucket = m_bucket(m)
    return selected(w.signature, bucket, problem(w, bucket), w.device.index)
