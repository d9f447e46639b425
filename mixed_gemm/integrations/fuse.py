"""One launch where a decoder block makes several: q/k/v and gate/up projections of Llama-,
Mistral- and Qwen2-family blocks fused into one prepacked weight each (outputs split as views).

- MLP: ``gate_proj``/``up_proj``/``down_proj`` with ``act_fn`` become :class:`FusedGateUpMLP`, whose
  own forward runs one gate-up matmul, splits it, and calls ``down_proj``.
- Attention: the attention module's forward (rotary, cache, kernels) stays transformers'. Its
  ``q_proj`` becomes a :class:`FusedQKV` that runs the q|k|v matmul once and hands ``k_proj`` and
  ``v_proj`` (:class:`QKVSlice`) their slices of that output. The hand-over is cleared by ``v_proj``,
  so no tensor outlives the forward (CUDA-graph trees require that), and a slice called with
  another input than q's computes the fused matmul itself instead of handing back stale data.
  Hand-overs go through a :class:`Slot` made at fusion: assigning a module attribute runs
  ``nn.Module.__setattr__``, whose checks cost more host time per eager decode step than the adds
  the residual fusion saves (docs/notes/end-to-end.md); a plain object's attribute is a store
  (and Dynamo traces it, where it does not trace a list's item assignment).

Fusing needs the projections to share bits, group size, zero mode, dtype and layout, and no
act-order permutation (each projection has its own); blocks that do not qualify stay as they were.

- Routers (``routers=True``, the default): each supported mixture-of-experts router becomes one
  launch (:mod:`.router`: logits, softmax, top-k and renormalization in one kernel).

- Norms (``norms=True``, the default): every transformers RMSNorm of the Llama form (the layers'
  norms, Qwen3's q and k norms, the final norm) becomes a :class:`~mixed_gemm.nn.OneKernelRMSNorm`
  (:mod:`.norms`), one launch where transformers' eager norm makes eight.

- Residual (``residual=True``): a pre-norm decoder layer (Llama, Mistral, Qwen2, Qwen3) adds its
  skip connections in the epilogues of ``o_proj`` and ``down_proj`` (:class:`SkipProj`) instead
  of two add kernels: the layer's forward is replaced on the instance (its class, hooks and
  module tree stay), and the layer hands each projection its residual just before the call.
  That forward also runs the layer's two RMSNorms as one ``torch.nn.functional.rms_norm`` each
  (transformers' eager RMSNorm is eight kernels and eight Python-level ops: an eager decode step is
  bound by its host thread, and the norms were a third of a layer's launches). Statistics are fp32
  as in transformers; the weight multiplies before the one rounding (transformers rounds the
  normalized value first), so outputs may differ in the last bit, as Inductor's do. A norm with
  forward hooks, another dtype than its input or a class of its own runs as it was.
"""
from __future__ import annotations

import types
from typing import Optional, Sequence

import torch
from torch import nn

from ..nn import QuantLinear
from ..ops import prepack
from .norms import fuse_norms, one_kernel_norm, rms_norm
from .router import fuse_routers


class Slot:
    """One value handed from a module to another within a forward (see the module docstring)."""

    def __init__(self):
        self.value = None


def _fusable(layers: Sequence[nn.Module]) -> bool:
    if not all(isinstance(m, QuantLinear) for m in layers):
        return False
    first = layers[0]
    same = all((m.in_features, m.bits, m.group_size, m.zero_mode, m.layout, m.scales.dtype, m.scales.device)
               == (first.in_features, first.bits, first.group_size, first.zero_mode, first.layout,
                   first.scales.dtype, first.scales.device) for m in layers)
    return same and all(m.perm is None for m in layers)


def concat(layers: Sequence[QuantLinear]) -> QuantLinear:
    """One QuantLinear whose output is the layers' outputs side by side (same input)."""
    parts = [m.packed().unpack() for m in layers]
    q = torch.cat([p[0] for p in parts])
    s = torch.cat([p[1] for p in parts])
    z = None if parts[0][2] is None else torch.cat([p[2] for p in parts])
    first = layers[0]
    pw0 = first.packed()
    mode = "int" if pw0.zero_mode == "sym" else pw0.zero_mode
    w = prepack(q, s, z, format="plain", bits=first.bits, group_size=first.group_size, zero_mode=mode,
                dtype=first.scales.dtype, layout=first.layout)
    biases = [m.bias for m in layers]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([torch.zeros(m.out_features, dtype=w.dtype, device=w.device) if b is None else b
                          for m, b in zip(layers, biases)])
    return QuantLinear.from_packed(w, bias, format=first.format, group_size=first.group_size)


def _is_silu(act_fn) -> bool:
    """transformers' "silu" activation (``nn.SiLU`` or its own ``SiLUActivation``)."""
    return isinstance(act_fn, nn.SiLU) or type(act_fn).__name__ in ("SiLUActivation", "SiLU")


class FusedGateUpMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up in one matmul; with ``gated=True``, SiLU
    and no bias (Llama, Mistral, Qwen2), SiLU·mul runs in that matmul's epilogue
    (``QuantLinear.silu_mul``). Off by default: on the H100 it is slower than the tuned gemv plus
    SiLU·mul today (the 8B decode step 1.78x -> 1.70x over fp16; docs/notes/end-to-end.md)."""

    def __init__(self, gate_up: QuantLinear, down_proj: nn.Module, act_fn, intermediate: int, gated: bool = False):
        super().__init__()
        self.gate_up, self.down_proj, self.act_fn, self.intermediate = gate_up, down_proj, act_fn, intermediate
        self.gated = gated and _is_silu(act_fn) and gate_up.bias is None

    def forward(self, x):
        if self.gated:
            return self.down_proj(self.gate_up.silu_mul(x))
        gate, up = self.gate_up(x).split(self.intermediate, -1)
        return self.down_proj(self.act_fn(gate) * up)


class FusedQKV(nn.Module):
    """Stands in for ``q_proj``: one q|k|v matmul; keeps k and v for :class:`QKVSlice` until read."""

    def __init__(self, qkv: QuantLinear, sizes: Sequence[int]):
        super().__init__()
        self.qkv, self.sizes = qkv, tuple(sizes)
        self._handover = Slot()  # (x, k, v) from q's call until v's

    def split(self, x) -> Sequence[torch.Tensor]:
        return self.qkv(x).split(self.sizes, -1)

    def forward(self, x):
        q, k, v = self.split(x)
        self._handover.value = (x, k, v)
        return q


class QKVSlice(nn.Module):
    """Stands in for ``k_proj`` (index 1) or ``v_proj`` (index 2)."""

    def __init__(self, owner: FusedQKV, index: int):
        super().__init__()
        self._owner = [owner]  # a list: not registered as a child twice
        self.index = index

    def forward(self, x):
        owner = self._owner[0]
        slot = owner._handover
        hand = slot.value
        out = hand[self.index] if hand is not None and hand[0] is x else owner.split(x)[self.index]
        if self.index == 2:
            slot.value = None  # nothing outlives the attention's projections
            # v goes straight into the KV cache (k passes the rotary embedding first): as a strided
            # slice of q|k|v it sends transformers' cache torch.cat of the whole cache down the
            # non-vectorized path every step; one small copy is cheaper (a no-op at batch 1).
            out = out.contiguous()
        return out


class SkipProj(nn.Module):
    """Stands in for a residual-fused layer's ``o_proj`` / ``down_proj``: ``proj(x) + residual``
    with the residual the layer handed over for this call (cleared when read, so no tensor outlives
    the forward); called without one it is ``proj(x)``."""

    def __init__(self, proj: QuantLinear):
        super().__init__()
        self.proj = proj
        self._handover = Slot()  # the residual of the current call, written by the layer

    def forward(self, x):
        slot = self._handover
        residual, slot.value = slot.value, None
        return self.proj(x, residual=residual)


# Pre-norm decoder layers whose forward is exactly: h = x + o_proj(attn(input_layernorm(x)));
# out = h + down_proj(mlp(post_attention_layernorm(h))) (Gemma's extra norms are not).
RESIDUAL_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")


def _residual_forward(self, hidden_states, *args, **kwargs):
    """The layer's forward with both skip connections in the projections' epilogues and the norms
    as one kernel each (positional extras, which transformers does not pass, take the class's own
    forward)."""
    if args:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    o_slot, down_slot = self._mg_skip_slots
    o_slot.value = hidden_states
    norms = self._mg_norms
    if norms is None:
        h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        down_slot.value = h
        return self.mlp(self.post_attention_layernorm(h))
    h, _ = self.self_attn(hidden_states=rms_norm(norms[0], hidden_states), **kwargs)
    down_slot.value = h
    return self.mlp(rms_norm(norms[1], h))


def decoder_projections(layer: nn.Module):
    """``(o_proj, down_proj)`` of a pre-norm decoder layer (:data:`RESIDUAL_LAYERS`, with its norms,
    attention and MLP) whose forward is still its class's, else None."""
    if type(layer).__name__ not in RESIDUAL_LAYERS or "forward" in vars(layer):
        return None
    parts = [getattr(layer, n, None) for n in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")]
    if any(p is None for p in parts):
        return None
    return getattr(parts[1], "o_proj", None), getattr(parts[3], "down_proj", None)


def _residual_fusable(layer: nn.Module) -> bool:
    rows = decoder_projections(layer)
    return rows is not None and all(isinstance(r, QuantLinear) for r in rows)


def fuse_residual(model: nn.Module) -> int:
    """Move the skip connections of every qualifying decoder layer of ``model`` into the epilogues
    of its (quantized) ``o_proj`` and ``down_proj``, in place (module docstring); returns how many
    layers changed."""
    fused = 0
    for layer in list(model.modules()):
        if _residual_fusable(layer):
            o, down = SkipProj(layer.self_attn.o_proj), SkipProj(layer.mlp.down_proj)
            layer.self_attn.o_proj, layer.mlp.down_proj = o, down
            # The slots again, as a plain attribute: the forward skips two nn.Module.__getattr__ lookups.
            layer._mg_skip_slots = (o._handover, down._handover)
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            layer._mg_norms = norms if all(one_kernel_norm(n) for n in norms) else None
            layer.forward = types.MethodType(_residual_forward, layer)
            fused += 1
    return fused


def fuse_projections(model: nn.Module, gated: bool = False, residual: bool = False, routers: bool = True,
                     norms: bool = True) -> int:
    """Fuse q/k/v and gate/up of every qualifying block of ``model`` in place (QuantLinear
    projections, see the module docstring); returns how many groups were fused. ``gated``: SiLU·mul
    in the gate|up epilogue where the MLP allows it (:class:`FusedGateUpMLP`; off by default).
    ``residual``: also :func:`fuse_residual` (the layers it changes are not counted). ``routers``:
    also :func:`~.router.fuse_routers`, each supported mixture-of-experts router one launch (not
    counted). ``norms``: also :func:`~.norms.fuse_norms`, each transformers RMSNorm one launch
    (:class:`~mixed_gemm.nn.OneKernelRMSNorm`; not counted)."""
    fused = 0
    for module in list(model.modules()):
        names = ("q_proj", "k_proj", "v_proj")
        if all(isinstance(getattr(module, n, None), nn.Module) for n in names):
            layers = [getattr(module, n) for n in names]
            if _fusable(layers):
                head = FusedQKV(concat(layers), [m.out_features for m in layers])
                module.q_proj, module.k_proj, module.v_proj = head, QKVSlice(head, 1), QKVSlice(head, 2)
                fused += 1
        names = ("gate_proj", "up_proj", "down_proj")
        if all(isinstance(getattr(module, n, None), nn.Module) for n in names) and hasattr(module, "act_fn"):
            gate, up = module.gate_proj, module.up_proj
            if _fusable([gate, up]) and gate.out_features == up.out_features:
                mlp = FusedGateUpMLP(concat([gate, up]), module.down_proj, module.act_fn, gate.out_features, gated)
                _replace(model, module, mlp)
                fused += 1
    if norms:
        fuse_norms(model)
    if residual:
        fuse_residual(model)
    if routers:
        fuse_routers(model)
    return fused


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)
                return
    raise ValueError("module not found in model")  # pragma: no cover
