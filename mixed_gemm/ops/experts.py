"""Mixture-of-experts weights and layer (issue #24): ``E`` experts' weights as one stacked prepacked
copy, and ``moe``: gate|up GEMM, SiLU(gate) * up, down GEMM, weighted sum over the top-k.

Layout contract (:class:`PackedExperts`): expert ``e``'s weight is exactly the :class:`PackedWeight`
that :func:`prepack` makes for its ``(N, K)`` matrix, and the stacked tensors hold those
PackedWeights' tensors along a new leading dimension: ``b[e]``, ``scales[e]``, ``zeros[e]`` (each
``PackedWeight``'s shapes, contiguous, so expert ``e`` starts ``e * b[0].numel()`` elements into
``b``). A grouped kernel reads expert ``e`` at that stride; :meth:`PackedExperts.expert` is the same
expert as a zero-copy PackedWeight, which every dense family runs.

``w13`` holds each expert's gate rows ``[0, I)`` then its up rows ``[I, 2I)`` (transformers'
``gate_up_proj``, vLLM's ``w13``), ``(2I, H)``; ``w2`` its down projection ``(H, I)``.

Execution today: on the CPU the float32 reference (:func:`mixed_gemm.reference.moe` of the
dequantized experts); on a GPU, one gate|up and one down :func:`matmul` per expert that got tokens
(the grouped family that does it in one launch is the rest of issue #24). Finding those experts
reads the routing on the host, so this path cannot be captured in a CUDA graph; it says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .matmul import matmul
from .packed import PackedWeight, prepack


@dataclass(frozen=True)
class PackedExperts:
    """``E`` experts' ``(N, K)`` weights, stacked (module docstring: the layout contract)."""

    b: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    n: int
    k: int
    bits: int
    group_size: int
    zero_mode: str
    layout: str

    @property
    def num_experts(self) -> int:
        return self.b.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.b.device

    def expert(self, e: int) -> PackedWeight:
        """Expert ``e`` as a PackedWeight over the stacked tensors (no copy)."""
        return PackedWeight(b=self.b[e], scales=self.scales[e], zeros=None if self.zeros is None else self.zeros[e],
                            n=self.n, k=self.k, bits=self.bits, group_size=self.group_size,
                            zero_mode=self.zero_mode, perm=None, layout=self.layout, aux=())

    def dequantize(self) -> torch.Tensor:
        """float32 ``(E, N, K)``: every expert's weight, for the reference."""
        from ..reference import dequantize

        out = []
        for e in range(self.num_experts):
            w = self.expert(e)
            q, s, z = w.unpack()
            out.append(dequantize(q, s, z, group_size=w.group_size if w.num_groups > 1 else -1, bits=w.bits,
                                  zero_mode="offset" if w.zero_mode == "offset" else "int"))
        return torch.stack(out)


def prepack_experts(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], *, bits: int = 4,
                    group_size: int = 128, zero_mode: str = "int", dtype: torch.dtype = torch.float16,
                    layout: str = "auto") -> PackedExperts:
    """Canonical per-expert ``q`` ``(E, N, K)``, ``s``/``z`` ``(E, N, num_groups)`` (``z``: ``None``
    for symmetric weights), as :func:`mixed_gemm.quantize` makes them expert by expert, into one
    :class:`PackedExperts` on their device. Each expert goes through :func:`prepack` (its rules and
    errors); ``layout`` as there (one layout: a grouped kernel reads one)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected (E, N, K) codes, got shape {tuple(q.shape)}")
    if layout not in ("auto", "sm80", "sm90a"):
        raise ValueError(f"layout: experts hold one layout, 'auto', 'sm80' or 'sm90a'; got {layout!r}")
    parts = [prepack(q[e], s[e], None if z is None else z[e], format="plain", bits=bits, group_size=group_size,
                     zero_mode=zero_mode, dtype=dtype, layout=layout) for e in range(q.shape[0])]
    first = parts[0]
    return PackedExperts(b=torch.stack([p.b for p in parts]), scales=torch.stack([p.scales for p in parts]),
                         zeros=None if first.zeros is None else torch.stack([p.zeros for p in parts]),
                         n=first.n, k=first.k, bits=first.bits, group_size=first.group_size,
                         zero_mode=first.zero_mode, layout=first.layout)


def _check(x, w13: PackedExperts, w2: PackedExperts, topk_weights, topk_ids) -> None:
    """The rules, each a ValueError/TypeError naming the argument, before anything runs."""
    if not isinstance(w13, PackedExperts) or not isinstance(w2, PackedExperts):
        raise TypeError(f"w13, w2: expected PackedExperts (mixed_gemm.prepack_experts), got "
                        f"{type(w13).__name__} and {type(w2).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a (T, H) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    t, h = x.shape
    if w13.n % 2:
        raise ValueError(f"w13: expected (E, 2I, H) with an even 2I, got N={w13.n}")
    inter = w13.n // 2
    if w13.k != h:
        raise ValueError(f"w13: expected K = H = {h} (x's last dimension), got K={w13.k}")
    if (w2.num_experts, w2.n, w2.k) != (w13.num_experts, h, inter):
        raise ValueError(f"w2: expected (E, H, I) = ({w13.num_experts}, {h}, {inter}) to match w13 and x, got "
                         f"({w2.num_experts}, {w2.n}, {w2.k})")
    if x.dtype != w13.dtype or w2.dtype != w13.dtype:
        raise TypeError(f"x: dtype must equal the experts' ({w13.dtype}), got x {x.dtype}, w2 {w2.dtype}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids, topk_weights: expected equal (T={t}, top_k) shapes, got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected int32 or int64 expert ids, got {topk_ids.dtype}")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights: expected floating point, got {topk_weights.dtype}")
    for name, tensor in (("w13", w13.b), ("w2", w2.b), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if tensor.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (same as x), got {tensor.device}")


def moe(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """A SiLU-gated mixture-of-experts layer: for each token ``t``,
    ``y[t] = sum_j topk_weights[t, j] * W2[e] @ (silu(gate_e x_t) * up_e x_t)`` with
    ``e = topk_ids[t, j]`` and ``gate_e``/``up_e`` the two halves of ``W13[e]``.

    ``x`` ``(T, H)`` float16/bfloat16 (the experts' dtype), ``w13`` ``(E, 2I, H)`` and ``w2``
    ``(E, H, I)`` :class:`PackedExperts`, ``topk_weights`` float ``(T, k)``, ``topk_ids`` int
    ``(T, k)`` in ``[0, E)``. Returns ``(T, H)`` in ``x``'s dtype. Expert ids out of range raise
    ``ValueError`` (this path reads the routing on the host anyway)."""
    _check(x, w13, w2, topk_weights, topk_ids)
    if x.is_cuda and torch.cuda.is_current_stream_capturing():  # before any host read of the routing
        raise RuntimeError("mixed_gemm.moe: this build runs one GEMM pair per routed expert and reads the routing on "
                           "the host, which a CUDA graph cannot capture; the grouped kernel family (issue #24) will")
    e_count = w13.num_experts
    flat = topk_ids.reshape(-1)
    if not flat.numel():
        return torch.zeros_like(x)
    # One host read: the ids' range and each expert's pair count (ids clamped for the count only).
    stats = torch.cat([flat.min().view(1), flat.max().view(1),
                       torch.bincount(flat.clamp(0, e_count - 1), minlength=e_count)]).tolist()
    lo, hi, counts = stats[0], stats[1], stats[2:]
    if lo < 0 or hi >= e_count:
        raise ValueError(f"topk_ids: expert ids must lie in [0, {e_count}) (E), got {lo if lo < 0 else hi}")
    if x.device.type != "cuda":
        from ..reference import moe as reference_moe

        return reference_moe(x.float(), w13.dequantize(), w2.dequantize(), topk_weights.float(), topk_ids).to(x.dtype)
    inter = w13.n // 2

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        h = matmul(rows, w13.expert(e))
        return matmul((torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]).contiguous(), w2.expert(e))

    return per_expert(x, topk_weights, topk_ids, counts, expert)


def per_expert(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, counts, expert) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * expert(e, x rows routed to e)`` accumulated in float32, one
    ``expert(e, rows)`` call per expert with pairs (``counts[e]`` of them, read on the host): the
    per-expert loop of transformers' eager experts, for ``moe`` on a GPU and the dense baseline."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        pairs = order[start:start + c]
        start += c
        tokens = pairs // topk_ids.shape[1]
        y = expert(e, x.index_select(0, tokens))
        out.index_add_(0, tokens, y.float() * topk_weights.reshape(-1).index_select(0, pairs).float().unsqueeze(1))
    return out.to(x.dtype)
