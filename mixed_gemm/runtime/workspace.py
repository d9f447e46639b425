"""Per-stream split-K scratch: an fp32 partial-sum buffer and zeroed semaphores, reused by every call.

Keyed by (device, stream) so that two streams in flight never share a semaphore or a partial sum.

Buffers only grow (doubling), and a replaced buffer is retired, never freed: kernels still in
flight, or recorded in a CUDA graph, keep valid memory without any host synchronization, so growth
is safe during graph capture too. Semaphores are zeroed once; the serial split-K kernel leaves
them at zero when it finishes.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import torch

_BUFFERS: Dict[Tuple[int, int, str], torch.Tensor] = {}
_RETIRED: List[torch.Tensor] = []
_LOCK = threading.Lock()
_MIN_FLOATS = 1 << 20
_MIN_SEMAPHORES = 1 << 14


def _get(device_index: int, stream: int, kind: str, numel: int, dtype, minimum: int, zero: bool) -> torch.Tensor:
    key = (device_index, stream, kind)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < numel:
        with _LOCK:
            buf = _BUFFERS.get(key)
            if buf is None or buf.numel() < numel:
                size = max(numel, minimum, 0 if buf is None else 2 * buf.numel())
                make = torch.zeros if zero else torch.empty
                if buf is not None:
                    _RETIRED.append(buf)
                buf = _BUFFERS[key] = make(size, dtype=dtype, device=f"cuda:{device_index}")
    return buf


def workspace(device_index: int, stream: int, floats: int) -> torch.Tensor:
    return _get(device_index, stream, "partials", floats, torch.float32, _MIN_FLOATS, zero=False)


def semaphores(device_index: int, stream: int, count: int) -> torch.Tensor:
    return _get(device_index, stream, "semaphores", count, torch.int32, _MIN_SEMAPHORES, zero=True)
