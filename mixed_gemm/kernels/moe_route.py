"""What the grouped tile families (moe_sm90a, moe_sm80) do around their one GEMM launch per
projection: sort the (token, slot) pairs by expert on the device, gather their rows, and finish
the down projection with its one-pass route kernel (templates/common/moe_route.cuh), the top-k
weighted sum. The gate|up GEMM forms SiLU(gate) * up in its own epilogue (the gate|up stack's
interleaved rows, templates/common/gate_up.cuh) and writes only ``h``.

Nothing here reads a tensor's values on the host: an expert's row count lives only in device
tensors, so a call is legal under CUDA-graph capture. Rows and rounding: the routed rows are sorted
by expert (stable; pairs whose id lies outside ``[0, E)`` sort last and are never computed),
gathered and multiplied (fp32 accumulation); gate|up rounds ``g`` and ``u`` to the activation dtype,
forms ``silu(g) * u`` in fp32 and rounds once; down's output rows are rounded once, and its route
kernel scatters each pair's row back, multiplies it by its fp32 top-k weight and adds a token's
slots in fp32 (a fixed order: deterministic), rounding ``y`` once.
"""
from __future__ import annotations

import torch


class SortedGroupedLauncher:
    """The launcher interface of every grouped family (see ``moe_gemv.launch``) for families whose
    kernel computes each expert's contiguous block of sorted rows. Subclasses provide ``stage``
    (``"w13"`` or ``"w2"``) and the two device calls :meth:`gemm` and :meth:`combine`."""

    stage = "w13"
    # The two stages can hand h over in their own sorted row order (see __call__'s sorted_h).
    sorted_pairs = True

    def gemm(self, rows: torch.Tensor, w, counts: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
             stream: int) -> None:
        """``out[r] = rows[r] W_e^T`` for the rows ``[offsets[e], offsets[e] + counts[e])`` of each
        expert ``e`` (int64 device tensors; rows past the last expert's are left as they are); the
        gate|up stage writes ``silu(gate) * up`` of that product instead (``out`` ``(rows, I)``)."""
        raise NotImplementedError

    def combine(self, o, pos, weights, out, tokens: int, hidden: int, top_k: int, stream: int) -> None:
        """``out[t] = sum_j weights[t, j] * o[pos[t k + j]]`` (slots with ``pos < 0`` add nothing)."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, w, ids: torch.Tensor, weights, out: torch.Tensor, tokens: int, top_k: int,
                 stream: int, sorted_h: bool = False) -> None:
        """One stage: ``x`` the stage's rows (w13: ``(tokens, H)``; w2: ``h``, ``(tokens * top_k, I)``),
        ``w`` the stacked experts, ``ids`` ``(tokens, top_k)``, ``weights`` fp32 ``(tokens, top_k)``
        (w2; None for w13), ``out`` ``h`` (w13) or ``y``. ``sorted_h`` (both stages, same ids): ``h``
        stays in the sorted pair order the GEMMs use (gate|up writes it so, down reads it so)
        instead of pair order, saving a scatter and a gather of ``h``; the sort is stable, so both
        stages sort alike."""
        pairs = tokens * top_k
        if pairs == 0:
            return
        e = w.num_experts
        flat = ids.reshape(-1)
        valid = (flat >= 0) & (flat < e)
        key = torch.where(valid, flat.long(), e)
        order = torch.sort(key, stable=True).indices
        counts = torch.zeros(e + 1, dtype=torch.int64, device=x.device).scatter_add_(0, key, torch.ones_like(key))[:e]
        offsets = torch.cumsum(counts, 0) - counts
        if self.stage == "w13":
            rows = x.index_select(0, order // top_k)
            if sorted_h:  # rows past the experts' (out-of-range ids) stay unwritten: down never reads them
                self.gemm(rows, w, counts, offsets, out, stream)
            else:  # pair order: an out-of-range pair's row is 0
                hs = torch.zeros_like(out)
                self.gemm(rows, w, counts, offsets, hs, stream)
                out.index_copy_(0, order, hs)
        else:
            rows = x if sorted_h else x.index_select(0, order)
            o = torch.empty((pairs, w.n), dtype=x.dtype, device=x.device)
            self.gemm(rows, w, counts, offsets, o, stream)
            # pos[p]: pair p's row among the sorted ones; -1 where no expert computed it.
            pos = torch.empty_like(order).index_copy_(0, order, torch.arange(pairs, device=x.device))
            pos = torch.where(valid, pos, -1)
            self.combine(o, pos, weights, out, tokens, w.n, top_k, stream)
