"""Float32 oracle for mixed-input GEMM: dequantize canonical ``(q, s, z)`` and multiply.

Depends on torch only; every result is computed in float32 on the inputs' device.

Canonical operands (see :mod:`mixed_gemm.formats`): ``q`` integer ``(N, K)`` in ``[0, 2**bits)``,
``s`` float ``(N, NG)``, ``z`` ``(N, NG)`` or ``None``.  Element ``(n, k)`` belongs to group
``grp(k) = k // G`` (``G = group_size``, ``-1`` meaning ``K``), or ``g_idx[k]`` when ``g_idx`` is given.

``zero_mode`` selects how ``z`` enters (room for further modes later):

* ``"int"`` (default): ``w = (q - z[n, grp]) * s[n, grp]``.  ``z`` may be an integer-valued tensor
  (AWQ/GPTQ) or any float tensor (HQQ-style fractional zero points); ``z=None`` means the symmetric
  zero ``2**(bits - 1)``.
* ``"offset"``: ``w = q * s[n, grp] + z[n, grp]``, ``z`` holding the per-group float offset ``m``
  (``z=None`` is an error).
"""
from __future__ import annotations

from typing import Optional

import torch

ZERO_MODES = ("int", "float", "offset")  # "float" computes as "int": (q - z) s with any z


def _check(cond: bool, msg: str, exc: type = ValueError) -> None:
    if not cond:
        raise exc(msg)


def _tensor(name: str, t: object, ndim: Optional[int], kind: str) -> torch.Tensor:
    _check(isinstance(t, torch.Tensor), f"{name}: expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if kind == "int":
        ok = not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
    elif kind == "float":
        ok = t.is_floating_point()
    else:
        ok = t.dtype != torch.bool and not t.is_complex()
    label = {"int": "an integer", "float": "a floating-point", "real": "a real-valued"}[kind]
    _check(ok, f"{name}: expected {label} tensor, got dtype {t.dtype}", TypeError)
    if ndim is not None:
        _check(t.dim() == ndim, f"{name}: expected a {ndim}-D tensor, got shape {tuple(t.shape)}")
    return t


def _scale_and_zero(q, s, z, *, group_size, bits, g_idx, zero_mode):
    """Validate; return per-element float32 ``(N, K)`` scale and zero/offset."""
    _tensor("q", q, 2, "int")
    _tensor("s", s, 2, "float")
    _check(isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 8,
           f"bits: expected an int in [1, 8], got {bits!r}")
    _check(isinstance(group_size, int) and not isinstance(group_size, bool)
           and (group_size == -1 or group_size > 0),
           f"group_size: expected -1 or a positive int, got {group_size!r}")
    _check(zero_mode in ZERO_MODES, f"zero_mode: expected one of {ZERO_MODES}, got {zero_mode!r}")
    n, k = q.shape
    _check(n > 0 and k > 0, f"q: expected a non-empty (N, K) tensor, got shape {tuple(q.shape)}")
    g = k if group_size == -1 else group_size
    if z is None:
        _check(zero_mode == "int", "z: zero_mode='offset' needs the per-group offset tensor, got None")
    else:
        _tensor("z", z, 2, "real")
        _check(z.shape == s.shape, f"z: expected shape {tuple(s.shape)} (same as s), got {tuple(z.shape)}")
    if g_idx is not None:
        _tensor("g_idx", g_idx, 1, "int")
    for name, t in (("s", s), ("z", z), ("g_idx", g_idx)):
        if t is not None:
            _check(t.device == q.device, f"{name}: expected device {q.device} (same as q), got {t.device}")
    _check(int(q.min()) >= 0 and int(q.max()) < (1 << bits),
           f"q: expected values in [0, {1 << bits}) for bits={bits}")
    if g_idx is None:
        ng = -(-k // g)
        _check(tuple(s.shape) == (n, ng),
               f"s: expected shape {(n, ng)} (N, ceil(K / group_size)), got {tuple(s.shape)}")
        idx = torch.arange(k, device=q.device) // g
    else:
        _check(g_idx.shape[0] == k, f"g_idx: expected shape ({k},) (one group per K), got {tuple(g_idx.shape)}")
        _check(s.shape[0] == n, f"s: expected {n} rows (N), got shape {tuple(s.shape)}")
        _check(int(g_idx.min()) >= 0 and int(g_idx.max()) < s.shape[1],
               f"g_idx: expected values in [0, {s.shape[1]}) (columns of s)")
        idx = g_idx.long()
    scale = s.float()[:, idx]
    if z is None:
        zero = torch.full_like(scale, float(1 << (bits - 1)))
    else:
        zero = z.float()[:, idx]
    return scale, zero


def dequantize(
    q: torch.Tensor,
    s: torch.Tensor,
    z: Optional[torch.Tensor],
    *,
    group_size: int,
    bits: int = 4,
    g_idx: Optional[torch.Tensor] = None,
    zero_mode: str = "int",
) -> torch.Tensor:
    """Dequantize canonical ``(q, s, z)`` to a float32 ``(N, K)`` weight.

    Args:
        q: integer (normally uint8) ``(N, K)``, values in ``[0, 2**bits)``.
        s: float ``(N, K // G)``; with ``g_idx``: ``(N, NG)`` with ``NG > max(g_idx)``.
        z: ``(N, NG)`` like ``s`` (any real dtype) or ``None``; meaning set by ``zero_mode``.
        group_size: ``G`` > 0 dividing K, or ``-1`` (``G = K``).  Ignored for indexing when
            ``g_idx`` is given (still validated).
        bits: weight width (1..8); sets the range of ``q`` and the symmetric zero ``2**(bits-1)``.
        g_idx: optional integer ``(K,)`` group of each input channel (GPTQ act-order); ``q`` is in the
            original K order.
        zero_mode: ``"int"``: ``w = (q - z) * s`` (``z=None`` -> ``2**(bits-1)``; float ``z`` allowed);
            ``"offset"``: ``w = q * s + z`` with ``z`` the per-group float offset.

    Returns:
        float32 ``(N, K)`` on ``q``'s device, computed entirely in float32.
    """
    scale, zero = _scale_and_zero(q, s, z, group_size=group_size, bits=bits, g_idx=g_idx,
                                  zero_mode=zero_mode)
    qf = q.float()
    if zero_mode == "offset":
        return qf * scale + zero
    return (qf - zero) * scale


def matmul(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    z: Optional[torch.Tensor],
    *,
    group_size: int,
    bits: int = 4,
    bias: Optional[torch.Tensor] = None,
    g_idx: Optional[torch.Tensor] = None,
    zero_mode: str = "int",
) -> torch.Tensor:
    """Reference mixed-input GEMM: ``x.float() @ dequantize(q, s, z, ...).T (+ bias.float())``.

    Args:
        x: float ``(..., K)`` activations (any float dtype; upcast to float32).
        q, s, z, group_size, bits, g_idx, zero_mode: as for :func:`dequantize`.
        bias: optional ``(N,)`` tensor, added in float32.

    Returns:
        float32 ``(..., N)``.
    """
    w = dequantize(q, s, z, group_size=group_size, bits=bits, g_idx=g_idx, zero_mode=zero_mode)
    n, k = w.shape
    _tensor("x", x, None, "float")
    _check(x.dim() >= 1 and x.shape[-1] == k, f"x: expected shape (..., {k}) (K), got {tuple(x.shape)}")
    _check(x.device == q.device, f"x: expected device {q.device} (same as q), got {x.device}")
    out = x.float() @ w.t()
    if bias is not None:
        _tensor("bias", bias, 1, "real")
        _check(tuple(bias.shape) == (n,), f"bias: expected shape ({n},) (N), got {tuple(bias.shape)}")
        _check(bias.device == q.device, f"bias: expected device {q.device} (same as q), got {bias.device}")
        out = out + bias.float()
    return out


def moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Reference mixture-of-experts layer (SiLU-gated MLP experts), in float32.

    Args:
        x: float ``(T, H)`` tokens.
        w13: float ``(E, 2I, H)``: each expert's gate rows ``[0, I)`` then up rows ``[I, 2I)``
            (dequantized, e.g. with :func:`dequantize` per expert).
        w2: float ``(E, H, I)``: each expert's down projection.
        topk_weights: float ``(T, k)``: the router's weight of each chosen expert.
        topk_ids: integer ``(T, k)``: the chosen experts, in ``[0, E)``, or ``-1`` for a pair that
            contributes nothing (expert parallelism: an expert that lives on another rank); its
            weight is never read.

    Returns:
        float32 ``(T, H)``: ``sum_j topk_weights[t, j] * w2[e] @ (silu(gate_e x_t) * (up_e x_t))``
        with ``e = topk_ids[t, j]``, over the slots with ``e != -1``.
    """
    _tensor("x", x, 2, "float")
    _tensor("w13", w13, 3, "float")
    _tensor("w2", w2, 3, "float")
    _tensor("topk_weights", topk_weights, 2, "float")
    _tensor("topk_ids", topk_ids, 2, "int")
    t, h = x.shape
    e, two_i, h13 = w13.shape
    _check(two_i % 2 == 0 and two_i > 0, f"w13: expected (E, 2I, H) with an even, non-zero 2I, got {tuple(w13.shape)}")
    inter = two_i // 2
    _check(h13 == h, f"w13: expected shape (E, 2I, {h}) (H of x), got {tuple(w13.shape)}")
    _check(tuple(w2.shape) == (e, h, inter), f"w2: expected shape ({e}, {h}, {inter}) (E, H, I), got {tuple(w2.shape)}")
    _check(topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == t,
           f"topk_ids, topk_weights: expected equal (T={t}, top_k) shapes, got {tuple(topk_ids.shape)} and "
           f"{tuple(topk_weights.shape)}")
    for name, other in (("w13", w13), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        _check(other.device == x.device, f"{name}: expected device {x.device} (same as x), got {other.device}")
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        _check(-1 <= lo and hi < e, f"topk_ids: expert ids must lie in [0, {e}) (E) or be -1 (a pair that "
                                    f"contributes nothing), got {lo if lo < -1 else hi}")
    xf = x.float()
    out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    for expert in range(e):
        rows, slots = (topk_ids == expert).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        gate_up = xf[rows] @ w13[expert].float().t()
        act = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, rows, (act @ w2[expert].float().t()) * topk_weights[rows, slots].float()[:, None])
    return out
