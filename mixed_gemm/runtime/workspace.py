"""Scratch memory for the kernels: split-K partial sums, zeroed semaphores, dequantized weights.

Allocated with ``cuMemAlloc`` outside torch's caching allocator, so it never lands in a CUDA-graph
memory pool: torch.compile's CUDA-graph trees require every live allocation in their pool to be a
tracked output, and a workspace that outlives the call would break that rule.

Keyed by (device, slot, kind). Eager calls use one slot per stream, so two streams in flight never
share a semaphore or a partial sum. Calls under stream capture use the device's ``GRAPH`` slot:
memory cannot be allocated while a stream captures, so every eager growth also grows the graph slot
to the same size, and the warm-up call that CUDA-graph trees (and manual capture) make eagerly
sizes it before capture. Graph replays of one device share the graph slot: replaying two graphs
concurrently on different streams is not supported.

Memory cost: per stream (and once more for graphs) the largest split-K partials and, where
dequant_mm runs, the largest dense weight it has dequantized. Buffers only grow and a replaced
buffer is retired, never freed: kernels still in flight,
or recorded in a CUDA graph, keep valid memory without any host synchronization. Semaphores are
zeroed once; the split-K kernels leave them at zero.

Growing never synchronizes the device: a first call of a larger size during eager decode must
not wait for the kernels in flight, and emulated tensor-parallel ranks on one GPU grow their
workspaces while a peer's kernel may wait for them. New semaphores are zeroed by
``cuMemsetD8Async`` on the calling stream, so the kernels this call launches there see zeros
(the synchronous ``cuMemsetD8`` runs on the legacy default stream, and waiting for it meant a
context synchronization). The graph slot is zeroed on the same stream: a capture begins after a
device synchronization (``torch.cuda.graph`` and CUDA-graph trees make one), so its kernels see
zeros too.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import torch

from .driver import check, driver, primary_context

GRAPH = "graph"
_MIN_BYTES = {"partials": 4 << 20, "semaphores": 64 << 10, "dense": 0}
_LOCK = threading.Lock()


class _Buffer:
    """One raw device allocation; ``tensor`` is a uint8 torch view of it (zero-copy)."""

    __slots__ = ("ptr", "nbytes", "device_index", "_tensor", "__cuda_array_interface__")

    def __init__(self, device_index: int, nbytes: int, zero: bool, stream: int):
        drv = driver()
        with primary_context(device_index):
            self.ptr = int(check(drv.cuMemAlloc(nbytes), "cuMemAlloc"))
            if zero:  # ordered before what the caller launches on ``stream``; no host wait
                check(drv.cuMemsetD8Async(self.ptr, 0, nbytes, stream), "cuMemsetD8Async")
        self.nbytes, self.device_index, self._tensor = nbytes, device_index, None
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                                         "version": 3, "strides": None, "stream": None}

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            self._tensor = torch.as_tensor(self, device=f"cuda:{self.device_index}")
        return self._tensor


_BUFFERS: Dict[Tuple[int, object, str], _Buffer] = {}
_RETIRED: List[_Buffer] = []


def _grow(key: Tuple[int, object, str], nbytes: int, zero: bool, stream: int) -> _Buffer:
    old = _BUFFERS.get(key)
    if old is not None and old.nbytes >= nbytes:
        return old
    # Small buffers double (few regrowths); the dense weight of dequant_mm grows to exactly the
    # largest N x K seen, since doubling a 1 GB weight would waste a gigabyte.
    doubled = 0 if old is None or key[2] == "dense" else 2 * old.nbytes
    size = max(nbytes, _MIN_BYTES[key[2]], doubled)
    buf = _BUFFERS[key] = _Buffer(key[0], size, zero, stream)
    if old is not None:
        _RETIRED.append(old)
    return buf


try:  # torch.cuda.is_current_stream_capturing without its Python wrapper
    _capturing = torch._C._cuda_isCurrentStreamCapturing
except AttributeError:  # pragma: no cover - a CPU-only torch
    _capturing = torch.cuda.is_current_stream_capturing


def _get(device_index: int, stream: int, kind: str, nbytes: int, zero: bool) -> _Buffer:
    capturing = _capturing()
    key = (device_index, GRAPH if capturing else stream, kind)
    buf = _BUFFERS.get(key)
    if buf is None or buf.nbytes < nbytes:
        if capturing:
            raise RuntimeError(
                f"mixed_gemm: the {kind} workspace needs {nbytes} bytes during CUDA-graph capture, more than "
                "any eager call has used; memory cannot be allocated while a stream captures. Run the same "
                "call once eagerly (a warm-up) before capturing it.")
        with _LOCK:
            buf = _grow(key, nbytes, zero, stream)
            _grow((device_index, GRAPH, kind), buf.nbytes, zero, stream)  # what a later capture of this call needs
    return buf


def workspace(device_index: int, stream: int, floats: int) -> int:
    """Device pointer to at least ``floats`` fp32 partial sums for this stream (or graph capture)."""
    return _get(device_index, stream, "partials", 4 * floats, zero=False).ptr


def semaphores(device_index: int, stream: int, count: int) -> int:
    """Device pointer to at least ``count`` int32 semaphores, zero between calls."""
    return _get(device_index, stream, "semaphores", 4 * count, zero=True).ptr


def scratch(device_index: int, stream: int, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor of ``shape`` over this stream's scratch (no allocation after the first
    call of a size; its contents are garbage and valid until the next call on the stream)."""
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    buf = _get(device_index, stream, "dense", nbytes, zero=False)
    return buf.tensor[:nbytes].view(dtype).view(shape)
