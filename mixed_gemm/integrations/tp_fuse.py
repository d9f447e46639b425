"""Tensor-parallel decoder layers whose all-reduces carry the skip connection and the next RMSNorm:
the step servers fuse (vLLM's fused all-reduce + residual + RMSNorm), on the models
:func:`~mixed_gemm.integrations.tp.load_quantized_tp` builds.

A pre-norm decoder layer at TP > 1 runs, per row-parallel projection, GEMM (partial sums) ->
all-reduce -> add the skip connection -> RMSNorm of the sum, three or four kernels after the GEMM.
:func:`fuse_all_reduce_norms` makes ``o_proj`` and ``down_proj`` return their partial sums
(``reduce_results=False``) and replaces the layer's forward (on the instance; class, hooks and
module tree stay) with one that calls :func:`~mixed_gemm.nn.parallel.all_reduce_residual_rms_norm`
(our one-shot with the add and the norm in its epilogue, one kernel where ours serves the size)
twice per layer:

- after ``o_proj``: ``h = x + sum(o)``, normalized by ``post_attention_layernorm``;
- after ``down_proj``: ``x' = h + sum(down)``, normalized by the *next* layer's
  ``input_layernorm``, handed to that layer (a :class:`~mixed_gemm.integrations.fuse.Slot`
  holding ``(x', norm(x'))``, read and cleared by the next layer when it receives that very
  ``x'``; any other input is normalized there as usual). The last layer all-reduces and adds
  (the model's final norm stays the model's).

The first layer normalizes its input itself (one ``rms_norm``, as the single-GPU residual fusion of
:mod:`mixed_gemm.integrations.fuse` does). The fused norms follow transformers' LlamaRMSNorm steps
(fp32 statistics, the normalized value rounded before the weight), in the kernel and in its
fallback (NCCL, sizes ours does not serve, the CPU). Layers whose norms (transformers' Llama-family
RMSNorm) or projections (row-parallel, TP > 1, not already fused with their GEMM) do not qualify
keep their forward. ``o_proj``/``down_proj`` of a fused layer called on their own return partial sums.
"""
from __future__ import annotations

import types
from typing import List, Optional

import torch.distributed as dist
from torch import nn

from ..nn.parallel import RowParallelQuantLinear, all_reduce_residual_rms_norm, tensor_parallel_all_reduce
from ..ops.allreduce import group_name
from .fuse import Slot, decoder_projections
from .norms import one_kernel_norm, rms_norm


class _TPState:
    """What a fused layer's forward reads: its norms, its row-parallel layer (group, mode, name),
    the slot its input's norm arrives in and, unless last, the next layer's norm and slot."""

    def __init__(self, layer: nn.Module):
        self.in_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.row = layer.self_attn.o_proj
        self.slot = Slot()
        self.next_norm: Optional[nn.Module] = None
        self.next_slot: Optional[Slot] = None

    def reduce_add_norm(self, partial, residual, norm):
        row = self.row
        return all_reduce_residual_rms_norm(partial, residual, norm.weight, norm.variance_epsilon, group=row.group,
                                            mode=row.all_reduce, tp_size=row.tp_size, name=row.group_name)


def _forward(self, hidden_states, *args, **kwargs):
    """The layer's forward with its all-reduces fused (module docstring); positional extras, which
    transformers does not pass, take the class's own forward."""
    if args:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    st = self._mg_tp
    hand, st.slot.value = st.slot.value, None
    h = hand[1] if hand is not None and hand[0] is hidden_states else rms_norm(st.in_norm, hidden_states)
    attn, _ = self.self_attn(hidden_states=h, **kwargs)
    h, x = st.reduce_add_norm(attn, hidden_states, st.post_norm)
    partial = self.mlp(h)
    if st.next_norm is None:
        row = st.row
        return x + tensor_parallel_all_reduce(partial, row.group, row.all_reduce, row.group_name)
    h_next, x = st.reduce_add_norm(partial, x, st.next_norm)
    st.next_slot.value = (x, h_next)
    return x


def _qualifies(layer: nn.Module) -> bool:
    rows = decoder_projections(layer)
    if rows is None or not all(isinstance(r, RowParallelQuantLinear) and r.tp_size > 1 and r.reduce_results
                               and not r.fuse_all_reduce for r in rows):
        return False
    return one_kernel_norm(layer.input_layernorm) and one_kernel_norm(layer.post_attention_layernorm)


def fuse_all_reduce_norms(model: nn.Module) -> int:
    """Fuse each row-parallel all-reduce of every qualifying decoder layer of ``model`` (a
    tensor-parallel model: :func:`~mixed_gemm.integrations.tp.load_quantized_tp`, optionally
    :func:`~mixed_gemm.integrations.fuse.fuse_projections` without ``residual``) with the skip
    connection and the RMSNorm after it, in place (module docstring). Consecutive fused layers hand
    over the next norm; returns how many layers changed."""
    fused: List[nn.Module] = []
    for layer in list(model.modules()):
        if _qualifies(layer):
            row, down = layer.self_attn.o_proj, layer.mlp.down_proj
            if row.group_name is None and dist.is_available() and dist.is_initialized():
                row.group_name = group_name(row.group)  # a plain string for the compiled path
            row.reduce_results = down.reduce_results = False
            layer._mg_tp = _TPState(layer)
            layer.forward = types.MethodType(_forward, layer)
            fused.append(layer)
    # A decoder's layers are consecutive items of a ModuleList: each fused layer whose next item is
    # fused too hands it its output's norm.
    changed = {id(layer) for layer in fused}
    for layers in (m for m in model.modules() if isinstance(m, nn.ModuleList)):
        for prev, nxt in zip(layers, list(layers)[1:]):
            if id(prev) in changed and id(nxt) in changed:
                prev._mg_tp.next_norm, prev._mg_tp.next_slot = nxt._mg_tp.in_norm, nxt._mg_tp.slot
    return len(fused)
