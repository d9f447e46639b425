"""``mixed_gemm.dequantize``: a PackedWeight back to a dense ``(N, K)`` weight, on the GPU."""
from __future__ import annotations

from typing import Optional

import torch

from ..kernels import dequant_mm
from ..runtime import current_stream
from .packed import PackedWeight

_DEQUANTIZERS: dict = {}  # (DequantMMConfig, device) -> Dequantizer


def dequantize(w: PackedWeight, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The dense ``(N, K)`` weight of ``w`` in ``w.dtype``, computed by the same converters as
    :func:`mixed_gemm.matmul`: from the sm80 layout equal to ``mg.reference.dequantize`` rounded to
    ``w.dtype``; from the sm90a layout ``(q - 2**(bits-1)) s + z'`` with one fma in ``w.dtype``, as
    the kernels reading that layout compute it.
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
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")
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
    dev = w.device.index
    layout = "sm80" if "sm80" in w.layouts else w.layouts[0]
    config = dequant_mm.DequantMMConfig(dtype=w.kernel_dtype, bits=w.bits, zero_mode=w.zero_mode, layout=layout)
    fn = _DEQUANTIZERS.get((config, dev))
    if fn is None:
        fn = _DEQUANTIZERS[(config, dev)] = dequant_mm.FAMILY.dequantizer(config, dev)
    fn(w, y, current_stream(dev))
