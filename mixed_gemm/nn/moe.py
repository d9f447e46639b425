"""``QuantExperts``: quantized mixture-of-experts experts, a drop-in for transformers' experts modules.

transformers (5.x) keeps every routed expert of Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V2 in
one module (``MixtralExperts``, ``Qwen2MoeExperts``, ``Qwen3MoeExperts``, ``DeepseekV2Experts``)
with ``gate_up_proj`` ``(E, 2I, H)`` (gate rows, then up rows), ``down_proj`` ``(E, H, I)`` and
``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``, a SiLU-gated
MLP per expert. :class:`QuantExperts` has the same call and holds both projections as
:class:`~mixed_gemm.ops.experts.PackedExperts` (one stacked prepacked copy each); it runs
:func:`mixed_gemm.moe` on a GPU and the float32 reference on the CPU.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from ..formats import quantize
from ..ops.experts import PackedExperts, check_moe_inputs, check_routing, prepack_experts, routing_stats
from ..ops.moe import moe
from ..ops.library import moe_packed_op

_FIELDS = ("b", "scales", "zeros")


class QuantExperts(nn.Module):
    """Quantized experts (module docstring). Buffers (all in ``state_dict``): ``w13_b``,
    ``w13_scales``, ``w13_zeros`` and ``w2_b``, ``w2_scales``, ``w2_zeros``, the stacked tensors of
    :class:`PackedExperts` (``*_zeros`` ``None`` for symmetric weights in the sm80 layout).
    ``load_state_dict`` expects a module built from experts of the same shapes and kind."""

    def __init__(self, w13: PackedExperts, w2: PackedExperts, group_size: Optional[int] = None):
        super().__init__()
        _check_experts(w13, w2, group_size)
        self.num_experts, self.hidden_size, self.intermediate_size = w13.num_experts, w13.k, w2.k
        # the nominal group (-1: per channel), as quantized or as the checkpoint says; an expert
        # whose K is no larger holds one group
        self.group_size = group_size if group_size is not None else (
            w13.group_size if w13.scales.shape[1] > 1 else -1)
        self._meta = {name: {f: getattr(w, f) for f in ("n", "k", "bits", "group_size", "zero_mode", "layout",
                                                         "gate_up")}
                      for name, w in (("w13", w13), ("w2", w2))}
        for name, w in (("w13", w13), ("w2", w2)):
            for f in _FIELDS:
                self.register_buffer(f"{name}_{f}", getattr(w, f))
        self._dense: Optional[tuple] = None  # (buffers it was computed from, float32 (w13, w2)), CPU path

    @classmethod
    def from_experts(cls, experts: nn.Module, *, bits: int = 4, group_size: int = 128, symmetric: bool = False,
                     layout: str = "auto") -> "QuantExperts":
        """Quantize a transformers experts module (round to nearest, :func:`mixed_gemm.quantize` per
        expert) on its device; dtype as :meth:`QuantLinear.from_linear` picks it."""
        if not is_experts(experts):
            raise TypeError(f"experts: expected a module with 3-D gate_up_proj (E, 2I, H) and down_proj (E, H, I) "
                            f"parameters (transformers' *Experts), got {type(experts).__name__}")
        act = getattr(experts, "act_fn", None)
        if act is not None and not isinstance(act, nn.SiLU) and type(act).__name__ not in ("SiLU", "SiLUActivation"):
            raise ValueError(f"experts: the kernels fuse SiLU(gate) * up; this module's activation is "
                             f"{type(act).__name__}")
        w13, w2 = experts.gate_up_proj.detach(), experts.down_proj.detach()
        if w13.shape[0] != w2.shape[0] or w13.shape[2] != w2.shape[1] or w13.shape[1] != 2 * w2.shape[2]:
            raise ValueError(f"experts: gate_up_proj {tuple(w13.shape)} and down_proj {tuple(w2.shape)} are not "
                             "(E, 2I, H) and (E, H, I)")
        dtype = w13.dtype if w13.dtype in (torch.float16, torch.bfloat16) else torch.float16
        packed = []
        for w, gate_up in ((w13, True), (w2, False)):
            parts = [quantize(w[e], bits=bits, group_size=group_size, symmetric=symmetric) for e in range(w.shape[0])]
            z = None if parts[0][2] is None else torch.stack([p[2] for p in parts])
            packed.append(prepack_experts(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), z,
                                          bits=bits, group_size=group_size, dtype=dtype, layout=layout,
                                          gate_up=gate_up))
        return cls(*packed, group_size=group_size)

    @property
    def bits(self) -> int:
        return self._meta["w13"]["bits"]

    @property
    def zero_mode(self) -> str:
        return self._meta["w13"]["zero_mode"]

    def packed(self) -> Tuple[PackedExperts, PackedExperts]:
        """``(w13, w2)`` over the current buffers (after ``.to()`` / loading)."""
        buf = self._buffers
        return tuple(PackedExperts(**{f: buf[f"{name}_{f}"] for f in _FIELDS}, **self._meta[name])
                     for name in ("w13", "w2"))

    def dense_weights(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """float32 ``(E, 2I, H)`` and ``(E, H, I)``: the dequantized experts (cached)."""
        key = tuple(self._buffers[f"{n}_{f}"] for n in ("w13", "w2") for f in _FIELDS)
        if self._dense is None or any(a is not b for a, b in zip(self._dense[0], key)):
            w13, w2 = self.packed()
            self._dense = (key, (w13.dequantize(), w2.dequantize()))
        return self._dense[1]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """``(T, H)``: :func:`mixed_gemm.moe`'s layer (its routing convention: an index of ``-1``
        contributes nothing). Bad arguments raise ``ValueError``/``TypeError`` naming them before
        anything runs (metadata only on a GPU; on the CPU also the routing's values, as ``moe``)."""
        self._check_forward(hidden_states, top_k_index, top_k_weights)
        if hidden_states.is_cuda:
            w13, w2 = self.packed()
            if torch.compiler.is_compiling():  # traced: the registered op (fake implementation for shapes)
                return moe_packed_op(hidden_states, w13, w2, top_k_weights, top_k_index)
            return moe(hidden_states, w13, w2, top_k_weights, top_k_index)
        from ..reference import moe as reference_moe

        if top_k_index.numel():
            routing_stats(top_k_weights, top_k_index, self.num_experts, ("top_k_weights", "top_k_index"))
        w13, w2 = self.dense_weights()
        return reference_moe(hidden_states.float(), w13, w2, top_k_weights.float(),
                             top_k_index).to(hidden_states.dtype)

    def _check_forward(self, hidden_states, top_k_index, top_k_weights) -> None:
        for name, t in (("hidden_states", hidden_states), ("top_k_index", top_k_index),
                        ("top_k_weights", top_k_weights)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not hidden_states.is_floating_point():
            raise TypeError(f"hidden_states: expected floating point, got {hidden_states.dtype}")
        if hidden_states.dim() != 2 or hidden_states.shape[1] != self.hidden_size:
            raise ValueError(f"hidden_states: expected (T, H={self.hidden_size}), got {tuple(hidden_states.shape)}")
        check_routing(hidden_states.shape[0], top_k_weights, top_k_index, ("top_k_weights", "top_k_index"))
        device = self.w13_b.device
        for name, t in (("hidden_states", hidden_states), ("top_k_index", top_k_index),
                        ("top_k_weights", top_k_weights)):
            if t.device != device:
                raise ValueError(f"{name}: expected the experts' device {device}, got {t.device}")
        if hidden_states.is_cuda and hidden_states.dtype != self.w13_scales.dtype:
            raise TypeError(f"hidden_states: dtype must equal the experts' ({self.w13_scales.dtype}) on a GPU, got "
                            f"{hidden_states.dtype}")

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, bits={self.bits}, group_size={self.group_size}, "
                f"zero_mode={self.zero_mode}, layout={self._meta['w13']['layout']}")


def _check_experts(w13, w2, group_size) -> None:
    """QuantExperts' constructor rules: moe's (a gate|up stack and a down stack of one kind, shapes,
    dtype and device that match, checked with an input of ``H`` columns) and contiguous stacks
    (the grouped kernels' layout; ``.to()`` and loading keep it)."""
    if not isinstance(w13, PackedExperts) or not isinstance(w2, PackedExperts):
        raise TypeError(f"w13, w2: expected PackedExperts (mixed_gemm.prepack_experts), got "
                        f"{type(w13).__name__} and {type(w2).__name__}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)):
        raise TypeError(f"group_size: expected None or an int (-1 or positive), got {type(group_size).__name__}")
    if group_size is not None and not (group_size == -1 or group_size > 0):
        raise ValueError(f"group_size: expected None, -1 or a positive int, got {group_size!r}")
    if isinstance(w2.b, torch.Tensor) and isinstance(w13.b, torch.Tensor) and w2.device != w13.device:
        raise ValueError(f"w2: expected w13's device ({w13.device}), got {w2.device}")
    probe = torch.empty((0, w13.k), dtype=w13.dtype, device=w13.device)
    ids = torch.empty((0, 1), dtype=torch.long, device=w13.device)
    check_moe_inputs(probe, w13, w2, ids.float(), ids)
    for name, w in (("w13", w13), ("w2", w2)):
        for f in _FIELDS:
            t = getattr(w, f)
            if t is not None and not t.is_contiguous():
                raise ValueError(f"{name}.{f}: expected a contiguous stack (prepack_experts' tensors), got strides "
                                 f"{t.stride()}")


def is_experts(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers experts module (3-D ``gate_up_proj`` and ``down_proj``)."""
    w13, w2 = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor) and w13.dim() == 3 and w2.dim() == 3
