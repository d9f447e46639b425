"""Group-index helpers: per-group tensors (``s``, ``z``) -> per-element ``(N, K)`` tensors."""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C


def make_g_idx(k: int, group_size: int, *, device: Optional[torch.device] = None) -> torch.Tensor:
    """The contiguous-groups index: int32 ``(K,)`` with ``g_idx[k] = k // G`` (``G = K`` for ``-1``).

    Passing this ``g_idx`` anywhere is equivalent to passing none.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    g = C.resolve_group_size(C.check_group_size(group_size), k)
    return torch.arange(k, dtype=torch.int32, device=device) // g


def expand_groups(t: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """Per-group ``t`` ``(N, NG)`` -> per-element ``(N, K)``: ``out[n, k] = t[n, g_idx[k]]``.

    ``g_idx`` is an integer ``(K,)`` tensor with values in ``[0, NG)`` on ``t``'s device (GPTQ act-order
    index, or :func:`make_g_idx` for contiguous groups).  ``out`` has ``t``'s dtype.
    """
    C.check_tensor("t", t, dtypes=C.SCALE_DTYPES + C.INDEX_DTYPES, ndim=2)
    C.check_tensor("g_idx", g_idx, dtypes=C.INDEX_DTYPES, ndim=1)
    C.check_g_idx(g_idx, g_idx.shape[0], t.shape[1], t.device)
    return t[:, g_idx.long()]
