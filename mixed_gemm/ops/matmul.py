"""``mixed_gemm.matmul``: y = x @ dequant(W).T (+ bias) on the GPU."""
from __future__ import annotations

from typing import Optional

import torch

from ..codegen import KernelConfig
from ..codegen.abi import GemmArgs, ReduceArgs
from ..codegen.config import SPLIT_K_MODES
from ..runtime import current_stream, get_module, semaphores, workspace
from ..select import choose_config, m_bucket
from .dequantize import launch_dequantize
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
    """``y = x @ W.T + bias`` with ``W`` dequantized on the fly (``(q - z) s`` or ``q s + m``).

    Two forms:

    - ``matmul(x, w: PackedWeight, bias=None)``: the fast path; prepack once with :func:`prepack`.
    - ``matmul(x, qweight, scales, zeros, *, format="awq", bits=4, group_size=128, bias=None)``:
      prepacks on every call for ``x.dtype`` (convenience; see :func:`mixed_gemm.unpack`).

    ``x``: ``(..., K)`` in the weight's dtype (float16 or bfloat16), contiguous, 16-byte aligned, on
    the weight's CUDA device; any number of rows ``M >= 0``. Returns ``(..., N)`` in that dtype;
    fp32 accumulation. ``bias``: ``(N,)`` in that dtype. ``out``: optional contiguous result
    tensor (no allocation). Rules on ``N``/``K``/``group_size`` are those of :func:`prepack`.
    ``config`` forces a kernel configuration (sweeps, debugging); its dtype, bits and zero mode
    must match the weight. Otherwise the configuration comes from the GPU's profile, else the
    heuristics (:func:`mixed_gemm.select.choose_config`), once per weight and power-of-two M
    bucket. Every rule is checked before anything is launched.
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
    _check_x(x, w)
    if bias is not None:
        _check_bias(bias, w)

    k, n = w.k, w.n
    m = x.numel() // k
    shape = (*x.shape[:-1], n)
    if out is None:
        y = torch.empty(shape, dtype=w.dtype, device=x.device)
    else:
        if not isinstance(out, torch.Tensor) or out.device != x.device or out.dtype != w.dtype \
                or tuple(out.shape) != shape or not out.is_contiguous() or out.data_ptr() % 4:
            _fail(ValueError, f"out: expected a contiguous {w.dtype} tensor of shape {shape} on {x.device}")
        y = out
    if m == 0:
        return y

    if config is None:
        bucket = m_bucket(m)
        config = w._configs.get(bucket)
        if config is None:
            config = w._configs[bucket] = choose_config(bucket, n=n, k=k, bits=w.bits, zero_mode=w.zero_mode,
                                                        dtype=w.kernel_dtype, group_size=w.group_size,
                                                        device_index=x.device.index)
    elif (config.dtype, config.bits, config.zero_mode) != (w.kernel_dtype, w.bits, w.zero_mode):
        _fail(ValueError, f"config: {config.name} is for {config.dtype}/{config.bits}-bit/{config.zero_mode} "
                          f"weights, this weight is {w.kernel_dtype}/{w.bits}-bit/{w.zero_mode}")
    grid = None if config.method == "dequant_mm" else config.grid(m, w.n_pad)
    if grid is not None and grid[1] > _MAX_GRID_Y:
        _fail(ValueError, f"x: N={n} needs {grid[1]} column-tile groups, above the grid limit {_MAX_GRID_Y}")
    if w.perm is not None:  # act-order: K of the weight was reordered once at prepack
        x = x.index_select(-1, w.perm)

    device_index = x.device.index
    if device_index != torch.cuda.current_device():
        with torch.cuda.device(device_index):  # the launch goes to the current context
            _launch(config, x, w, bias, y, m, device_index, grid)
    else:
        _launch(config, x, w, bias, y, m, device_index, grid)
    return y


# (config, device) -> (gemm Function, reduce Function): one dict lookup per call (configs cache their hash).
_PLANS: dict = {}


def _plan(config: KernelConfig, device_index: int) -> tuple:
    module = get_module(config, device_index)
    plan = _PLANS[(config, device_index)] = (
        module.function(config.kernel_name, GemmArgs, config.threads, config.smem_bytes),
        module.function(config.kernel_name + "_reduce", ReduceArgs, 256))
    return plan


def _launch(config: KernelConfig, x, w: PackedWeight, bias, y, m: int, device_index: int, grid) -> None:
    if config.method == "dequant_mm":
        # Large M: one dense weight (in the stored K order, which x already follows), then cuBLAS.
        dense = torch.empty((w.n, w.k), dtype=w.dtype, device=y.device)
        launch_dequantize(w, dense)
        x2, y2 = x.reshape(m, w.k), y.view(m, w.n)
        if bias is None:
            torch.mm(x2, dense.t(), out=y2)
        else:
            torch.addmm(bias, x2, dense.t(), out=y2)
        return
    plan = _PLANS.get((config, device_index))
    if plan is None:
        plan = _plan(config, device_index)
    gemm, reduce = plan
    stream = current_stream(device_index)
    mode = config.split_k_mode if config.split_k > 1 else "none"
    ws = sem = 0
    if mode == "serial" or mode == "fused":
        ws = workspace(device_index, stream, m * w.n * (config.split_k if mode == "fused" else 1)).data_ptr()
        sem = semaphores(device_index, stream, grid[0] * grid[1]).data_ptr()
    elif mode == "parallel":
        ws = workspace(device_index, stream, config.split_k * m * w.n).data_ptr()
    with gemm.lock:
        a = gemm.args
        a.a = x.data_ptr()
        a.b = w.b.data_ptr()
        a.scales = w.scales.data_ptr()
        a.zeros = 0 if w.zeros is None else w.zeros.data_ptr()
        a.bias = 0 if bias is None else bias.data_ptr()
        a.c = y.data_ptr()
        a.workspace = ws
        a.semaphores = sem
        a.m, a.n, a.k = m, w.n, w.k
        a.n_pad, a.k16 = w.n_pad, w.k16
        a.lda, a.ldc = w.k, w.n
        a.group_shift, a.num_groups = w.group_shift, w.num_groups
        a.split_mode = SPLIT_K_MODES[mode]
        a.log_tile = config.swizzle.bit_length() - 1
        gemm.launch(grid, stream)
    if mode == "parallel":
        with reduce.lock:
            r = reduce.args
            r.workspace, r.bias, r.c = ws, 0 if bias is None else bias.data_ptr(), y.data_ptr()
            r.m, r.n, r.ldc, r.splits = m, w.n, w.n, config.split_k
            pairs = m * w.n // 2
            reduce.launch((min(max(1, (pairs + 255) // 256), 4096), 1, 1), stream)


