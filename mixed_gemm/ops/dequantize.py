"""``mixed_gemm.dequantize``: a PackedWeight back to a dense ``(N, K)`` weight, on the GPU."""
from __future__ import annotations

from typing import Optional

import torch

from ..codegen.abi import DequantArgs
from ..codegen.config import DequantConfig
from ..runtime import current_stream, get_module
from .packed import PackedWeight


def dequantize(w: PackedWeight, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The dense ``(N, K)`` weight of ``w`` in ``w.dtype``, computed by the same converters as
    :func:`mixed_gemm.matmul` (equal to ``mg.reference.dequantize`` rounded to ``w.dtype``).
    Act-order weights come back in their original K order. ``out``: optional contiguous
    ``(N, K)`` tensor of ``w.dtype`` (not allowed with act-order)."""
    if not isinstance(w, PackedWeight):
        raise TypeError(f"w: expected a PackedWeight, got {type(w).__name__}")
    if w.device.type != "cuda":
        raise ValueError(f"w: must be on a CUDA device, got {w.device}")
    shape = (w.n, w.k)
    if out is None:
        y = torch.empty(shape, dtype=w.dtype, device=w.device)
    else:
        if out.device != w.device or out.dtype != w.dtype or tuple(out.shape) != shape or not out.is_contiguous() \
                or w.perm is not None:
            raise ValueError(f"out: expected a contiguous {w.dtype} tensor of shape {shape} on {w.device} "
                             "(and a weight without act-order)")
        y = out
    with torch.cuda.device(w.device.index):
        launch_dequantize(w, y)
    if w.perm is not None:
        y = torch.empty_like(y).index_copy_(1, w.perm, y)  # column j of y is original column perm[j]
    return y


def launch_dequantize(w: PackedWeight, y: torch.Tensor) -> None:
    """Write ``w``'s dense weight, in its stored (act-order: permuted) K order, into the contiguous
    ``(N, K)`` tensor ``y`` on the current stream. No checks: callers validate."""
    cfg = DequantConfig(dtype=w.kernel_dtype, bits=w.bits, zero_mode=w.zero_mode)
    dev = w.device.index
    fn = get_module(cfg, dev).function(cfg.kernel_name, DequantArgs, cfg.threads)
    with fn.lock:
        a = fn.args
        a.b, a.scales = w.b.data_ptr(), w.scales.data_ptr()
        a.zeros = 0 if w.zeros is None else w.zeros.data_ptr()
        a.out = y.data_ptr()
        a.n, a.k, a.n_pad, a.k16, a.ldo = w.n, w.k, w.n_pad, w.k16, w.k
        a.group_shift, a.num_groups = w.group_shift, w.num_groups
        fn.launch(cfg.grid(w.n_pad, w.k16), current_stream(dev))
