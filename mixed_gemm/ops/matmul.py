"""``mixed_gemm.matmul``: y = x @ dequant(W).T (+ bias) on the GPU."""
from __future__ import annotations

from typing import Optional

import torch

from ..codegen import KernelConfig
from ..runtime import get_kernel
from ..select import heuristic_config, m_bucket
from .packed import PackedWeight, prepack

_MAX_GRID_Y = 65535


def _fail(exc: type, msg: str):
    raise exc(msg)


def _check_x(x, w: PackedWeight) -> None:
    if not isinstance(x, torch.Tensor):
        _fail(TypeError, f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.device != w.device:
        _fail(ValueError, f"x: must be on the weight's device {w.device}, got {x.device}")
    if x.device.type != "cuda":
        _fail(ValueError, f"x: must be a CUDA tensor (the kernels run on the GPU), got device {x.device}")
    if x.dtype != torch.float16:
        _fail(TypeError, f"x: expected dtype torch.float16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != w.k:
        _fail(ValueError, f"x: last dimension must equal the weight's K={w.k}, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        _fail(ValueError, "x: must be contiguous (rows are copied 16 bytes at a time); call .contiguous()")
    if x.data_ptr() % 16:
        _fail(ValueError, "x: data pointer must be 16-byte aligned (cp.async copies 16 bytes)")


def _check_bias(bias, w: PackedWeight) -> None:
    if not isinstance(bias, torch.Tensor):
        _fail(TypeError, f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    if bias.device != w.device or bias.dtype != torch.float16 or tuple(bias.shape) != (w.n,):
        _fail(ValueError, f"bias: expected a float16 ({w.n},) tensor on {w.device}, "
                          f"got {bias.dtype} {tuple(bias.shape)} on {bias.device}")
    if not bias.is_contiguous() or bias.data_ptr() % 4:
        _fail(ValueError, "bias: must be contiguous and 4-byte aligned")


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
    config: Optional[KernelConfig] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``y = x @ W.T + bias`` with ``W = (q - z) * s`` dequantized on the fly.

    Two forms:

    - ``matmul(x, w: PackedWeight, bias=None)``: the fast path; prepack once with :func:`prepack`.
    - ``matmul(x, qweight, scales, zeros, *, format="awq", bits=4, group_size=128, bias=None)``:
      prepacks on every call (convenience; see :func:`mixed_gemm.unpack` for the formats).

    ``x``: float16 ``(..., K)``, contiguous, 16-byte aligned, on the weight's CUDA device; any
    number of rows ``M >= 0``. Returns float16 ``(..., N)``; fp32 accumulation. ``bias``: float16
    ``(N,)``. ``out``: optional float16 ``(..., N)`` contiguous result tensor (no allocation).
    Rules on ``N``/``K``/``group_size`` are those of :func:`prepack` (``K % 8 == 0``;
    ``group_size`` -1 or a power of two >= 32; any ``N`` the format allows). ``config`` forces a
    kernel configuration (sweeps, debugging). Every rule is checked before anything is launched.
    """
    if not isinstance(w, PackedWeight):
        if not isinstance(w, torch.Tensor):
            _fail(TypeError, f"w: expected a PackedWeight or a qweight tensor, got {type(w).__name__}")
        if scales is None:
            _fail(ValueError, "scales: required when w is a raw qweight tensor")
        w = prepack(w, scales, zeros, format=format, bits=bits, group_size=group_size)
    elif scales is not None or zeros is not None:
        _fail(ValueError, "scales/zeros: pass them to prepack(), not with a PackedWeight")
    _check_x(x, w)
    if bias is not None:
        _check_bias(bias, w)

    k = w.k
    m = x.numel() // k
    shape = (*x.shape[:-1], w.n)
    if out is None:
        y = torch.empty(shape, dtype=torch.float16, device=x.device)
    else:
        if not isinstance(out, torch.Tensor) or out.device != x.device or out.dtype != torch.float16 \
                or tuple(out.shape) != shape or not out.is_contiguous() or out.data_ptr() % 4:
            _fail(ValueError, f"out: expected a contiguous float16 tensor of shape {shape} on {x.device}")
        y = out
    if m == 0:
        return y

    if config is None:
        bucket = m_bucket(m)
        config = w._configs.get(bucket)
        if config is None:
            config = w._configs[bucket] = heuristic_config(bucket, bits=w.bits, zero_mode=w.zero_mode)
    elif config.bits != w.bits or config.zero_mode != w.zero_mode:
        _fail(ValueError, f"config: {config.name} is for {config.bits}-bit/{config.zero_mode} weights, "
                          f"this weight is {w.bits}-bit/{w.zero_mode}")
    grid = config.grid(m, w.n_pad)
    if grid[1] > _MAX_GRID_Y:
        _fail(ValueError, f"x: M={m} rows need {grid[1]} row tiles of {config.tile[0]}, above the grid limit "
                          f"{_MAX_GRID_Y}; split x into chunks")

    device_index = x.device.index
    kernel = get_kernel(config, device_index)

    def fill(a):
        a.a = x.data_ptr()
        a.b = w.b.data_ptr()
        a.scales = w.scales.data_ptr()
        a.zeros = 0 if w.zeros is None else w.zeros.data_ptr()
        a.bias = 0 if bias is None else bias.data_ptr()
        a.c = y.data_ptr()
        a.m, a.n, a.k = m, w.n, k
        a.n_pad, a.k16 = w.n_pad, w.k16
        a.lda, a.ldc = k, w.n
        a.group_shift, a.num_groups = w.group_shift, w.num_groups

    if device_index != torch.cuda.current_device():
        with torch.cuda.device(device_index):  # the launch goes to the current context
            kernel.launch(grid, fill)
    else:
        kernel.launch(grid, fill)
    return y
