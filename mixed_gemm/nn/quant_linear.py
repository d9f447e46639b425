"""``QuantLinear``: a drop-in ``nn.Linear`` replacement holding a quantized weight."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..formats import FORMATS, check_finite, quantize
from ..kernels import LAYOUTS, layout_names
from ..ops import PackedWeight, matmul, packed_view, prepack, silu_mul_matmul
from ..ops.packed import KERNEL_BITS, KERNEL_DTYPES, LOWBIT_BITS
from ..reference import dequantize as reference_dequantize

ZERO_MODES = ("int", "sym", "float", "offset")
# The CPU reference path computes in float32 and casts back, so it also takes float32 activations
# (a float32 model); the kernels take the layer's dtype only.
REFERENCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLOAT_BUFFERS = ("scales", "zeros", "aux_scales", "aux_zeros", "bias")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _check_int(name: str, value, rule: str, ok) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int ({rule}), got {type(value).__name__}")
    if not ok(value):
        raise ValueError(f"{name}: expected {rule}, got {value}")


def check_layer_args(in_features, out_features, bits, group_size, zero_mode, format, dtype, layout) -> None:
    """The constructor's arguments, by prepack's rules (a layer prepack could not fill is refused
    when built, not when its state dict or first input arrives)."""
    _check_int("in_features", in_features, "K > 0, a multiple of 8: x rows are loaded 16 bytes at a time",
               lambda k: k > 0 and k % 8 == 0)
    _check_int("out_features", out_features, "N > 0, even: the kernels store outputs in pairs",
               lambda n: n > 0 and n % 2 == 0)
    _check_int("bits", bits, f"one of {KERNEL_BITS}, the kernels' widths", lambda b: b in KERNEL_BITS)
    _check_int("group_size", group_size, "-1 or a positive int", lambda g: g == -1 or g > 0)
    if group_size != -1 and group_size < in_features and (group_size < 32 or group_size & (group_size - 1)):
        raise ValueError(f"group_size: must be -1, >= in_features or a power of two >= 32 (prepack's rule), "
                         f"got {group_size} for in_features={in_features}")
    if zero_mode not in ZERO_MODES:
        raise ValueError(f"zero_mode: expected one of {ZERO_MODES}, got {zero_mode!r}")
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"format: expected one of {FORMATS} (the checkpoint's), got {format!r}")
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"dtype: must be torch.float16 or torch.bfloat16 (the activation dtype), got {dtype}")
    if (layout_names(layout) == ("lowbit",)) != (bits in LOWBIT_BITS):
        raise ValueError(f"layout: {LOWBIT_BITS}-bit weights (7: 1:2-sparse) use 'lowbit', and only they; got "
                         f"layout={layout!r} for bits={bits}")


class QuantLinear(nn.Module):
    """``y = x @ W.T + bias`` with ``W`` an int4/int8 group-quantized ``(out_features, in_features)``
    weight, stored prepacked in the kernel's layout (:class:`mixed_gemm.PackedWeight`).

    Buffers (all in ``state_dict``), in ``layout`` (``"sm80"``, or ``"sm90a"``: what prepack picks
    on the H100): ``b`` int32 atoms, ``scales`` and ``zeros`` (``None`` when symmetric in the sm80
    layout) ``(num_groups, N_pad)`` in the activation dtype, ``perm`` (GPTQ act-order K
    permutation, else ``None``), ``bias`` (``(N,)`` or ``None``); with ``layout="sm80+sm90a"`` also
    ``aux_b``, ``aux_scales``, ``aux_zeros``: a second copy in the sm90a layout.
    ``load_state_dict`` expects a module built with the same arguments.

    ``forward`` on CUDA runs :func:`mixed_gemm.matmul` (under ``torch.compile`` through the custom
    op ``torch.ops.mixed_gemm.matmul``). On the CPU it computes the float32 reference
    (:mod:`mixed_gemm.reference`) and casts back to ``x.dtype``; it caches the dense float32 weight.
    That path exists for tests and debugging, not speed.
    """

    # 2: 3-bit weights hold whole 3-bit fields in the lowbit layout (version 1: bit planes). A version-1
    # state dict of a 3-bit layer would load without error and compute garbage, so it is refused.
    _version = 2

    def __init__(self, in_features: int, out_features: int, *, bits: int = 4, group_size: int = 128,
                 zero_mode: str = "int", bias: bool = False, act_order: bool = False, format: str = "plain",
                 dtype: torch.dtype = torch.float16, device=None, layout: str = "sm80"):
        super().__init__()
        check_layer_args(in_features, out_features, bits, group_size, zero_mode, format, dtype, layout)
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.zero_mode, self.format = bits, zero_mode, format
        self.group_size = group_size  # as given: -1 (per-channel) or the checkpoint's group size
        groups = 1 if group_size == -1 else _ceil(in_features, group_size)
        names = layout_names(layout)
        self.layout = layout
        b_shape, p_shape = LAYOUTS[names[0]].shapes(out_features, in_features, bits, groups)
        kw = dict(device=device)
        self.register_buffer("b", torch.empty(b_shape, dtype=torch.int32, **kw))
        self.register_buffer("scales", torch.empty(p_shape, dtype=dtype, **kw))
        keep_zeros = zero_mode != "sym" or LAYOUTS[names[0]].ALWAYS_ZEROS
        self.register_buffer("zeros", torch.empty(p_shape, dtype=dtype, **kw) if keep_zeros else None)
        aux_shapes = LAYOUTS[names[1]].shapes(out_features, in_features, bits, groups) if len(names) > 1 else None
        for name, shape, dt in (("aux_b", 0, torch.int32), ("aux_scales", 1, dtype), ("aux_zeros", 1, dtype)):
            self.register_buffer(name, None if aux_shapes is None else torch.empty(aux_shapes[shape], dtype=dt, **kw))
        self.register_buffer("perm", torch.empty(in_features, dtype=torch.int64, **kw) if act_order else None)
        self.register_buffer("bias", torch.empty(out_features, dtype=dtype, **kw) if bias else None)
        self._pw: Optional[PackedWeight] = None
        self._dense: Optional[tuple] = None  # (buffers it was computed from, float32 weight)

    # ---- construction ----
    @classmethod
    def from_packed(cls, w: PackedWeight, bias: Optional[torch.Tensor] = None, *, format: str = "plain",
                    group_size: Optional[int] = None) -> "QuantLinear":
        """Wrap an existing PackedWeight (tensors are shared, not copied). ``group_size``: the nominal
        one (default: the weight's; give it when K <= group size made a single group)."""
        if group_size is None:
            group_size = -1 if w.num_groups == 1 else w.group_size
        mod = cls(w.k, w.n, bits=w.bits, group_size=group_size,
                  zero_mode=w.zero_mode, bias=bias is not None, act_order=w.perm is not None, format=format,
                  dtype=w.dtype, device="meta", layout=w.layout)
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
                raise TypeError(f"bias: expected a floating-point tensor or None, got "
                                f"{getattr(bias, 'dtype', type(bias).__name__)}")
            if tuple(bias.shape) != (w.n,):
                raise ValueError(f"bias: expected shape ({w.n},) (out_features), got {tuple(bias.shape)}")
            check_finite("bias", bias)
        mod.b, mod.scales, mod.zeros, mod.perm = w.b, w.scales, w.zeros, w.perm
        if w.aux:
            mod.aux_b, mod.aux_scales, mod.aux_zeros = w.aux
        mod.bias = None if bias is None else bias.detach().to(device=w.device, dtype=w.dtype)
        return mod

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, bits: int = 4, group_size: int = 128,
                    symmetric: bool = False, layout: str = "auto") -> "QuantLinear":
        """Quantize an ``nn.Linear`` (round to nearest, :func:`mixed_gemm.quantize`) on its device. The
        module's dtype is the weight's for float16/bfloat16 weights, else float16 (a float32 model
        keeps working on the CPU reference path; the GPU kernels need float16/bfloat16 activations).
        ``layout``: as for :func:`mixed_gemm.prepack` (default: the device's)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        if not weight.is_floating_point():
            raise TypeError(f"linear: weight must be floating point, got {weight.dtype}")
        dtype = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.float16
        q, s, z = quantize(weight, bits=bits, group_size=group_size, symmetric=symmetric)
        w = prepack(q, s, z, format="plain", bits=bits, group_size=group_size, dtype=dtype, layout=layout)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_packed(w, bias, format="plain", group_size=group_size)

    @classmethod
    def from_checkpoint(cls, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                        bias: Optional[torch.Tensor] = None, *, format: str, bits: int, group_size: int,
                        g_idx: Optional[torch.Tensor] = None, zero_mode: str = "int",
                        dtype: Optional[torch.dtype] = None, shape=None) -> "QuantLinear":
        """From a checkpoint's tensors (see :func:`mixed_gemm.unpack` for ``format``; ``shape``:
        ``(N, K)`` for ``"hqq"``), on their device."""
        if dtype is None:
            dtype = getattr(scales, "dtype", None)  # (not a tensor: prepack names scales)
            dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
        w = prepack(qweight, scales, zeros, format=format, bits=bits, group_size=group_size, g_idx=g_idx,
                    zero_mode=zero_mode, dtype=dtype, shape=shape)
        return cls.from_packed(w, bias, format=format, group_size=group_size)

    # ---- use ----
    def packed(self) -> PackedWeight:
        """The PackedWeight over this module's current buffers (rebuilt after ``.to()`` / loading)."""
        pw, buf = self._pw, self._buffers  # _buffers directly: nn.Module.__getattr__ is slow on a hot path
        if pw is None or pw.b is not buf["b"] or pw.scales is not buf["scales"] or pw.zeros is not buf["zeros"] \
                or pw.perm is not buf["perm"] or (pw.aux and pw.aux[0] is not buf["aux_b"]):
            g = self.in_features if self.group_size == -1 or self.scales.shape[0] == 1 else self.group_size
            pw = self._pw = packed_view(self.b, self.scales, self.zeros, self.perm, self.out_features,
                                        self.in_features, self.bits, g, self.zero_mode, self.layout, self._aux())
        return pw

    def _aux(self) -> list:
        buf = self._buffers
        return [] if buf["aux_b"] is None else [buf["aux_b"], buf["aux_scales"], buf["aux_zeros"]]

    def dense_weight(self) -> torch.Tensor:
        """The float32 ``(N, K)`` weight of the reference, in the original K order (cached)."""
        key = (self.b, self.scales, self.zeros, self.perm)
        if self._dense is None or any(a is not b for a, b in zip(self._dense[0], key)):
            pw = self.packed()
            q, s, z = pw.unpack()
            w = reference_dequantize(q, s, z, group_size=pw.group_size if pw.num_groups > 1 else -1, bits=self.bits,
                                     zero_mode="offset" if self.zero_mode == "offset" else "int")
            if self.perm is not None:
                w = torch.empty_like(w).index_copy_(1, self.perm, w)
            self._dense = (key, w)
        return self._dense[1]

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x @ W.T (+ bias) (+ residual)``; ``residual`` (the output's shape and dtype; a decoder
        block's skip connection) is added before the one rounding where the kernel's epilogue
        takes it (:func:`mixed_gemm.matmul`). Bad input raises a ValueError/TypeError naming it:
        the kernels' rules on CUDA (:func:`mixed_gemm.matmul`), on the CPU ``x`` of a float dtype
        with ``in_features`` columns on the layer's device."""
        if isinstance(x, torch.Tensor) and x.is_cuda:
            if torch.compiler.is_compiling():  # traced: the op takes the buffers, no PackedWeight here
                buf = self._buffers
                g = self.in_features if self.group_size == -1 or buf["scales"].shape[0] == 1 else self.group_size
                return torch.ops.mixed_gemm.matmul(x, buf["b"], buf["scales"], buf["zeros"], buf["perm"], buf["bias"],
                                                   self.out_features, self.in_features, self.bits, g, self.zero_mode,
                                                   self.layout, self._aux(), residual)
            # A drop-in for nn.Linear takes any strides (transformers hands the lm_head a
            # hidden_states[:, -1:, :] view); matmul itself takes contiguous rows only.
            if residual is not None and not residual.is_contiguous():
                residual = residual.contiguous()
            return matmul(x if x.is_contiguous() else x.contiguous(), self.packed(), bias=self._buffers["bias"],
                          residual=residual)
        self._check_reference_input(x)
        w = self.dense_weight()
        bias = None if self.bias is None else self.bias.float()
        y = torch.nn.functional.linear(x.float(), w, bias)
        if residual is not None:
            if tuple(residual.shape) != tuple(y.shape) or residual.dtype != x.dtype:
                raise ValueError(f"residual: expected a {x.dtype} tensor of the output's shape {tuple(y.shape)}, "
                                 f"got {residual.dtype} {tuple(residual.shape)}")
            y = y + residual.float()
        return y.to(x.dtype)

    def _check_reference_input(self, x) -> None:
        """The CPU path's rules (``F.linear``'s own errors name no argument)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in REFERENCE_DTYPES:
            raise TypeError(f"x: expected dtype torch.float16, torch.bfloat16 or torch.float32 (the CPU reference "
                            f"path), got {x.dtype}")
        device = self._buffers["b"].device
        if x.device != device:
            raise ValueError(f"x: must be on the layer's device {device}, got {x.device}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x: last dimension must equal in_features={self.in_features}, got shape {tuple(x.shape)}")

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """For a fused gate|up layer without bias (rows ``[0, I)`` gate, ``[I, 2I)`` up):
        ``silu(gate(x)) * up(x)``, with SiLU·mul in the kernel's epilogue at decode sizes
        (:func:`mixed_gemm.silu_mul_matmul`)."""
        if self._buffers["bias"] is not None:
            raise ValueError("silu_mul: the gate|up layer has a bias; the fused epilogue takes none (call it, then SiLU·mul)")
        if x.is_cuda:
            if torch.compiler.is_compiling():
                buf = self._buffers
                g = self.in_features if self.group_size == -1 or buf["scales"].shape[0] == 1 else self.group_size
                return torch.ops.mixed_gemm.silu_mul_matmul(x, buf["b"], buf["scales"], buf["zeros"], buf["perm"],
                                                            self.out_features, self.in_features, self.bits, g,
                                                            self.zero_mode, self.layout, self._aux())
            return silu_mul_matmul(x if x.is_contiguous() else x.contiguous(), self.packed())
        gate, up = self(x).float().split(self.out_features // 2, dim=-1)
        return (torch.nn.functional.silu(gate) * up).to(x.dtype)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if self.bits == 3 and local_metadata.get("version") == 1:
            raise ValueError(f"{prefix}b: this state dict holds 3-bit weights in the lowbit layout's bit planes "
                             "(QuantLinear version 1); they are now whole 3-bit fields: rebuild the layer from its "
                             "checkpoint (QuantLinear.from_checkpoint) or save_quantized output instead")
        for leaf in FLOAT_BUFFERS:  # once per load: a corrupt checkpoint's nan would surface as nan outputs
            t = state_dict.get(prefix + leaf)
            if isinstance(t, torch.Tensor) and not t.is_meta:
                check_finite(prefix + leaf, t)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, zero_mode={self.zero_mode}, format={self.format}, "
                f"act_order={self.perm is not None}, bias={self.bias is not None}, dtype={self.scales.dtype}")
