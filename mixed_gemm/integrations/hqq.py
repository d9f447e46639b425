"""Load a model saved by the ``hqq`` package (``AutoHQQHFModel.save_quantized``: ``config.json`` and
``qmodel.pt``, a ``{module name: state dict}`` of its ``HQQLinear`` layers and the rest) into
:class:`mixed_gemm.nn.QuantLinear` layers, without the ``hqq`` package.

An ``HQQLinear`` state holds ``W_q`` (bit-packed codes, ``meta["packing"]``), ``scale`` and ``zero``
(``(N K / G, 1)``: float zero points, ``w = (q - z) s``), ``nbits``, ``group_size``, ``shape``
``(N, K)``, ``axis`` (1: groups along K, the only one a GEMM kernel reads) and ``bias``
(:mod:`mixed_gemm.formats.hqq` has the exact packing). 1-, 2-, 3-, 4- and 8-bit layers load; the
1-3-bit ones into the lowbit layout.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from ..nn import QuantLinear
from .loading import check_load_args, discard_on_error, empty_model, finish_loading, set_submodule, set_tensor

WEIGHTS = "qmodel.pt"


def is_hqq_checkpoint(model_dir) -> bool:
    return (Path(model_dir) / WEIGHTS).is_file()


def _layer(state: dict, kdtype: torch.dtype, device) -> QuantLinear:
    axis = int(state.get("axis", 1))
    if axis != 1:
        raise ValueError(f"HQQ axis={axis}: only axis=1 (groups along K) is served")
    if state.get("quant_scale") or state.get("quant_zero"):
        raise ValueError("HQQ quantized scales/zeros (quant_scale/quant_zero) are not supported")
    n, k = (int(d) for d in state["shape"])
    bits, group = int(state["nbits"]), state["group_size"]
    group = k if group is None else int(group)
    w_q = state["W_q"]
    if state.get("view_as_float") and "unpack_view_dtype" in state:
        w_q = w_q.view(state["unpack_view_dtype"])
    scale, zero = state["scale"].to(kdtype), state["zero"].to(kdtype)
    bias = state.get("bias")
    return QuantLinear.from_checkpoint(w_q.to(device), scale.to(device), zero.to(device),
                                       None if bias is None else bias.to(device), format="hqq", bits=bits,
                                       group_size=group, dtype=kdtype, shape=(n, k))


def load_hqq(model_dir, *, dtype: torch.dtype = torch.float16, device="cuda") -> nn.Module:
    """The ``PreTrainedModel`` of an ``hqq``-saved ``model_dir`` in eval mode on ``device``, its
    HQQ linear layers as :class:`QuantLinear` (prepacked on ``device``), the other weights in ``dtype``.
    A truncated or corrupt ``qmodel.pt``, or a layer in it that breaks a rule, raises a ValueError
    naming the file (and the layer), and leaves nothing loaded."""
    from transformers import AutoConfig

    if not is_hqq_checkpoint(model_dir):
        raise ValueError(f"{model_dir}: no {WEIGHTS} (not a checkpoint saved by hqq's AutoHQQHFModel)")
    model_dir = check_load_args(model_dir, dtype, device)
    path = model_dir / WEIGHTS
    config = AutoConfig.from_pretrained(model_dir)
    weights = _read_weights(path)  # the whole file, before the model is built
    model = empty_model(config, dtype)
    with discard_on_error(model):
        _load_weights(model, weights, path, dtype, device)
        finish_loading(model, getattr(config, "tie_word_embeddings", False), device, WEIGHTS)
    return model.eval()


def _read_weights(path: Path) -> dict:
    """``qmodel.pt``: ``{module name: state dict}``; a file torch cannot read (truncated, corrupt) or
    one of another shape is a ValueError naming it."""
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable {WEIGHTS} (truncated or corrupt?): {why}") from None
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in weights.items()):
        raise ValueError(f"{path}: expected a {{module name: state dict}} (hqq's AutoHQQHFModel), got "
                         f"{type(weights).__name__}")
    return weights


def _load_weights(model: nn.Module, weights: dict, path: Path, dtype: torch.dtype, device) -> None:
    """``weights`` into ``model``: HQQ layers prepacked as :class:`QuantLinear`, the rest set. An error
    names ``path`` and the module (here, so that discard_on_error can clear this frame's tensors)."""
    kdtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
    for name, state in weights.items():
        try:
            if "W_q" in state:
                try:
                    target = model.get_submodule(name)
                except AttributeError:
                    raise ValueError("holds HQQ weights but the model has no such module") from None
                if not isinstance(target, nn.Linear):
                    raise ValueError(f"holds HQQ weights but is a {type(target).__name__}")
                set_submodule(model, name, _layer(state, kdtype, device))
                continue
            for leaf, t in state.items():
                if torch.is_tensor(t):
                    t = t.to(device)
                    set_tensor(model, f"{name}.{leaf}" if name else leaf, t.to(dtype) if t.is_floating_point() else t)
        except KeyError as err:
            raise ValueError(f"{path}: {name}: its HQQ state lacks {err}") from None
        except (ValueError, TypeError) as err:
            raise (TypeError if isinstance(err, TypeError) else ValueError)(f"{path}: {name}: {err}") from None


def save_hqq(model: nn.Module, out_dir) -> Path:
    """Write ``model`` (with :class:`QuantLinear` layers of 1, 2, 3, 4 or 8 bits) in the ``hqq``
    package's own format (``config.json`` + ``qmodel.pt``): ``AutoHQQHFModel.from_quantized`` and
    :func:`load_hqq` read it. Zero points are stored as HQQ's float zeros (exact for integer ones)."""
    from ..formats import hqq as hqq_format, pack

    quant = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    if not quant:
        raise ValueError("model: has no QuantLinear layers; run quantize_model first")
    weights = {}
    for name, m in quant.items():
        if m.bits not in hqq_format.PACKING:
            raise ValueError(f"{name}: {m.bits}-bit layers have no hqq packing (hqq packs {tuple(hqq_format.PACKING)} bits)")
        if m.perm is not None or m.zero_mode == "offset":
            raise ValueError(f"{name}: hqq stores neither act-order nor offset zeros")
        q, s, z = m.packed().unpack()
        if z is None:  # symmetric: the zero point 2**(bits-1)
            z = torch.full_like(s, float(1 << (m.bits - 1)))
        group = m.in_features if m.group_size == -1 else m.group_size
        w_q, scale, zero = pack(q, s, z, format="hqq", bits=m.bits, group_size=group)
        weights[name] = {
            "W_q": w_q.cpu(), "scale": scale.cpu(), "zero": zero.cpu(), "nbits": m.bits, "group_size": group,
            "shape": torch.Size((m.out_features, m.in_features)), "axis": 1,
            "packing": hqq_format.packing_name(m.bits), "unpack_view_dtype": hqq_format.PACKING[m.bits][1],
            "view_as_float": False, "quant_scale": False, "quant_zero": False,
            "compute_dtype": m.scales.dtype, "offload_meta": False, "stores_quant_config": True,
            "channel_wise": True, "optimize": False, "round_zero": False,
        }
        if m.bias is not None:
            weights[name]["bias"] = m.bias.detach().cpu()
    for name, module in model.named_modules():
        if name in quant or any(name.startswith(q + ".") for q in quant):
            continue
        own = {k: v.detach().cpu() for k, v in module.named_parameters(recurse=False)}
        own.update({k: v.detach().cpu() for k, v in module.named_buffers(recurse=False)
                    if k not in module._non_persistent_buffers_set})
        if own:
            weights[name] = own
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    torch.save(weights, out / WEIGHTS)
    return out
