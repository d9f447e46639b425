"""Quantized transformers models on mixed_gemm: load AutoAWQ / GPTQ checkpoints, quantize a loaded
fp16 model in place, save AutoAWQ-style checkpoints.

Checkpoint contract (what ``load_quantized`` reads and ``save_quantized`` writes): a directory with
``config.json`` whose ``quantization_config`` is

- AutoAWQ: ``{"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": bool,
  "version": "gemm", "modules_to_not_convert": [...] | null}``; tensors ``<linear>.qweight``
  int32 ``(K, N/8)``, ``.qzeros`` int32 ``(K/G, N/8)`` (when zero_point), ``.scales`` ``(K/G, N)``;
- GPTQ: ``{"quant_method": "gptq", "bits": 4|8, "group_size": G, "sym": bool, "desc_act": bool,
  "checkpoint_format": "gptq" | "gptq_v2"}``; tensors ``.qweight`` ``(K/P, N)``, ``.qzeros``,
  ``.scales``, ``.g_idx`` (used when desc_act);

plus ``model.safetensors`` or shards listed in ``model.safetensors.index.json``. ``K/G`` is
``ceil(K/G)`` when ``G`` does not divide ``K`` (a mixed_gemm extension; AutoAWQ needs K % G == 0).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

import torch
from torch import nn

from ..formats import make_g_idx, pack
from ..nn import QuantExperts, QuantLinear, is_experts
from .loading import (check_load_args, discard_on_error, empty_model, finish_loading, quantized_names, reading,
                      set_submodule, set_tensor, shard_files)
from .moe_checkpoint import ExpertCollector, expert_name, expert_tensors
from .fuse import fuse_projections  # noqa: F401  (re-exported: quantize/load, then fuse for inference)

SUFFIXES = ("qweight", "qzeros", "scales", "g_idx", "bias")


# ------------------------------------------------------------------ quantization_config
# A quantization_config is data read from a checkpoint's config.json, so every bad field (wrong type
# included) is a ValueError naming ``quantization_config.<field>``: callers catch one exception for
# "this checkpoint cannot be loaded", and nothing downstream (e.g. K / group_size) sees a bad value.


def _int_field(qc: dict, name: str, default) -> int:
    value = qc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"quantization_config.{name}: expected an int, got {value!r}")
    return value


def _bool_field(qc: dict, name: str, default: bool) -> bool:
    # No bool(): a JSON string "false" would read as True.
    value = qc.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"quantization_config.{name}: expected true or false, got {value!r}")
    return value


def _skip_field(qc: dict) -> tuple:
    value = qc.get("modules_to_not_convert") or ()  # null: convert everything
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"quantization_config.modules_to_not_convert: expected a list of module names or null, "
                         f"got {value!r}")
    return tuple(value)


def parse_quant_config(qc: dict) -> dict:
    """Validate a ``quantization_config``; returns ``dict(format, bits, group_size, symmetric,
    act_order, skip)``. Unsupported or malformed settings raise ``ValueError`` naming the setting."""
    if not isinstance(qc, dict):
        qc = qc.to_dict()
    method = qc.get("quant_method")
    if method not in ("awq", "gptq"):
        raise ValueError(f"quantization_config.quant_method: expected 'awq' or 'gptq', got {method!r}")
    bits = _int_field(qc, "bits", 4)
    group = _int_field(qc, "group_size", 128)
    if group != -1 and group <= 0:  # 0 would divide K by zero when the layers are built
        raise ValueError(f"quantization_config.group_size: expected -1 (one group spanning K) or a positive int, "
                         f"got {group}")
    skip = _skip_field(qc)
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization_config.version: only AutoAWQ 'gemm' checkpoints are supported, got {version!r}")
        if bits != 4:
            raise ValueError(f"quantization_config.bits: AutoAWQ checkpoints are 4-bit, got {bits}")
        return dict(format="awq", bits=4, group_size=group, symmetric=not _bool_field(qc, "zero_point", True),
                    act_order=False, skip=skip)
    if bits not in (4, 8):
        raise ValueError(f"quantization_config.bits: expected 4 or 8, got {bits}")
    fmt = qc.get("checkpoint_format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"quantization_config.checkpoint_format: expected 'gptq' or 'gptq_v2', got {fmt!r}")
    return dict(format=fmt, bits=bits, group_size=group, symmetric=_bool_field(qc, "sym", True),
                act_order=_bool_field(qc, "desc_act", False), skip=skip)


# ------------------------------------------------------------------ module surgery
def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(name == s or name.endswith("." + s) or name.startswith(s + ".") or ("." + s + ".") in name
               for s in skip)


# Mixture-of-experts routers (and Qwen2-MoE's shared-expert gate) stay in the model's dtype, as
# servers keep them: a few rows whose error would reroute tokens, never a bandwidth cost.
ROUTERS = ("gate", "shared_expert_gate")

# quantize_model(lm_head=...): the kinds an output head may take, as (bits, group size).
LM_HEAD_KINDS = {"int8": (8, -1), "int4": (4, 128)}


def quantize_model(model: nn.Module, *, bits: int = 4, group_size: int = 128, symmetric: bool = False,
                   skip: Sequence[str] = ("lm_head",), progress: bool = True, layout: str = "auto",
                   lm_head: Optional[str] = None) -> nn.Module:
    """Replace every ``nn.Linear`` of a loaded fp16/bf16 model (except names matching ``skip`` and
    mixture-of-experts routers, :data:`ROUTERS`) by a :class:`QuantLinear`, and every transformers
    experts module (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2: stacked ``gate_up_proj`` /
    ``down_proj``) by a :class:`~mixed_gemm.nn.QuantExperts`, quantized round-to-nearest, in place,
    on the layer's device (``layout``: as for :func:`mixed_gemm.prepack`, default the device's).
    Returns ``model``.

    ``lm_head``: also quantize the output head, ``"int8"`` (per output channel) or ``"int4"``
    (group 128). It is the largest single GEMM of a decode step (vocab x hidden) and stays fp16 by
    default because its error reaches the logits directly. A head tied to the input embeddings is
    untied (the embeddings stay in the model's dtype). Such a model holds two quantization kinds,
    which the AWQ/GPTQ checkpoint writer rejects."""
    from tqdm import tqdm

    if lm_head is not None and lm_head not in LM_HEAD_KINDS:
        raise ValueError(f"lm_head: expected None or one of {tuple(LM_HEAD_KINDS)}, got {lm_head!r}")
    names = [n for n, m in model.named_modules()
             if (isinstance(m, nn.Linear) and not _skipped(n, tuple(skip) + ROUTERS)
                 or is_experts(m) and not _skipped(n, skip))]
    for name in tqdm(names, desc="quantize", unit="layer", disable=not progress):
        mod = model.get_submodule(name)
        kind = QuantExperts.from_experts if is_experts(mod) else QuantLinear.from_linear
        set_submodule(model, name, kind(mod, bits=bits, group_size=group_size, symmetric=symmetric, layout=layout))
    if lm_head is not None:
        head = getattr(model, "lm_head", None)
        if not isinstance(head, nn.Linear):
            raise ValueError(f"lm_head={lm_head!r}: the model has no nn.Linear lm_head "
                             f"(found {type(head).__name__})")
        head_bits, head_group = LM_HEAD_KINDS[lm_head]
        model.lm_head = QuantLinear.from_linear(head, bits=head_bits, group_size=head_group, symmetric=symmetric,
                                                layout=layout)
        config = getattr(model, "config", None)
        if getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False  # so no later tie_weights() puts the fp16 weight back
    no_experts_switch(model)
    return model


def no_experts_switch(model: nn.Module) -> bool:
    """Once every transformers experts module of ``model`` is a :class:`QuantExperts`, mark its
    configs' experts implementation ``"eager"`` where it was ``"grouped_mm"``; returns whether it did.
    transformers' ``generate`` switches ``grouped_mm`` to ``batched_mm`` for decoding and back,
    walking every module twice a call (host time: ~2-4 ms of a 48-layer eager TTFT,
    docs/notes/end-to-end.md), and neither implementation runs any more. A model that still holds
    transformers experts keeps its implementation."""
    modules = list(model.modules())
    if any(is_experts(m) for m in modules) or not any(isinstance(m, QuantExperts) for m in modules):
        return False
    get = getattr(model, "get_experts_implementation", None)
    current = get() if get is not None else None
    if not isinstance(current, dict) or "grouped_mm" not in current.values():
        return False
    model.config._experts_implementation = {k: "eager" if v == "grouped_mm" else v for k, v in current.items()}
    return True


def save_quantized(model: nn.Module, out_dir, *, format: str = "awq") -> Path:
    """Write ``model`` (with :class:`QuantLinear` layers) as a checkpoint ``load_quantized`` and
    AutoAWQ-style loaders read: ``config.json`` with ``quantization_config`` and
    ``model.safetensors``. ``format``: ``"awq"`` (4-bit), ``"gptq"`` (4, 8-bit) or ``"hqq"`` (1, 2,
    3, 4, 8-bit: the ``hqq`` package's own ``qmodel.pt`` format, :mod:`mixed_gemm.integrations.hqq`)."""
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module (a transformers model), got {type(model).__name__}")
    if not callable(getattr(getattr(model, "config", None), "to_dict", None)):
        raise ValueError(f"model: expected a transformers model (its config becomes config.json), got a "
                         f"{type(model).__name__} without a config")
    if format == "hqq":
        from .hqq import save_hqq

        return save_hqq(model, out_dir)
    if format not in ("awq", "gptq"):
        raise ValueError(f"format: expected 'awq', 'gptq' or 'hqq', got {format!r}")
    quant = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    experts = {n: m for n, m in model.named_modules() if isinstance(m, QuantExperts)}
    if not quant and not experts:
        raise ValueError("model: has no QuantLinear layers; run quantize_model first")
    kinds = {(m.bits, m.group_size, m.zero_mode) for m in quant.values()}
    kinds |= {(m.bits, m.group_size, m.zero_mode) for m in experts.values()}
    if len(kinds) != 1:
        raise ValueError(f"model: a checkpoint holds one bits/group_size/zero kind, the layers have {sorted(kinds)}")
    bits, group, zero_mode = kinds.pop()
    if zero_mode in ("float", "offset"):
        raise ValueError(f"model: {zero_mode!r} zeros have no AWQ/GPTQ encoding (integer zero points only)")
    if format == "awq" and bits != 4:
        raise ValueError(f"format: 'awq' checkpoints are 4-bit, the layers are {bits}-bit; use format='gptq'")
    if bits not in (4, 8):
        raise ValueError(f"format: {format!r} checkpoints here are 4- or 8-bit, the layers are {bits}-bit; "
                         "use format='hqq' (1, 2, 3, 4, 8 bits)")
    tensors: Dict[str, torch.Tensor] = {}
    for name, m in quant.items():
        q, s, z = m.packed().unpack()
        g_idx = None
        if m.perm is not None:  # act-order: store the original K order with its g_idx (GPTQ only)
            if format != "gptq":
                raise ValueError("format: act-order layers need format='gptq'")
            inv = torch.empty_like(m.perm).index_copy_(0, m.perm, torch.arange(len(m.perm), device=m.perm.device))
            q = q.index_select(1, inv)
            g_idx = make_g_idx(m.in_features, group, device=q.device).index_select(0, inv)
        try:
            qweight, scales, qzeros = pack(q, s, z, format=format, bits=bits, group_size=group, g_idx=g_idx)
        except ValueError as e:  # e.g. a nan scale loaded into the layer: name it, write nothing
            raise ValueError(f"{name}: {e}") from None
        tensors[f"{name}.qweight"], tensors[f"{name}.scales"] = qweight, scales
        if qzeros is not None:
            tensors[f"{name}.qzeros"] = qzeros
        if format == "gptq":
            tensors[f"{name}.g_idx"] = g_idx if g_idx is not None else make_g_idx(m.in_features, group, device=q.device)
        if m.bias is not None:
            tensors[f"{name}.bias"] = m.bias
    for name, m in experts.items():
        tensors.update(expert_tensors(name, m, format=format))
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    for key, t in model.state_dict().items():
        owner = key.rpartition(".")[0]
        if owner in quant or owner in experts or (tied and key == "lm_head.weight"):
            continue
        tensors[key] = t
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = model.config.to_dict()
    skip = [n for n, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    if format == "awq":
        config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group,
                                         "zero_point": zero_mode != "sym", "version": "gemm",
                                         "modules_to_not_convert": skip or None}
    else:
        config["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group,
                                         "sym": zero_mode == "sym", "desc_act": any(m.perm is not None for m in quant.values()),
                                         "checkpoint_format": "gptq", "modules_to_not_convert": skip or None}
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    return out


# ------------------------------------------------------------------ loading
def read_config(model_dir: Path):
    """The transformers config of ``model_dir/config.json`` and its parsed ``quantization_config``
    (:func:`parse_quant_config`); errors name the file."""
    from transformers import AutoConfig

    path = model_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{path}: no such file (a checkpoint directory holds config.json)")
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a readable model config ({e})") from None
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        raise ValueError(f"{path}: has no quantization_config (not an AWQ/GPTQ checkpoint)")
    try:
        spec = parse_quant_config(qc)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return config, qc, spec


def load_quantized(model_dir, *, dtype: torch.dtype = torch.float16, device="cuda", progress: bool = True):
    """Build the model of ``model_dir/config.json`` without allocating its fp16 weights, replace every
    quantized ``nn.Linear`` by a :class:`QuantLinear`, stream the safetensors shards one by one,
    prepack, and return the ``PreTrainedModel`` in eval mode on ``device``. A directory saved by the
    ``hqq`` package (``qmodel.pt``) loads through :func:`mixed_gemm.integrations.hqq.load_hqq`.
    A defective checkpoint raises a ValueError naming the file and key, and leaves nothing loaded."""
    model_dir = check_load_args(model_dir, dtype, device)
    if (model_dir / "qmodel.pt").is_file():  # saved by the hqq package (or save_quantized(format="hqq"))
        from .hqq import load_hqq

        return load_hqq(model_dir, dtype=dtype, device=device)
    config, qc, spec = read_config(model_dir)
    del config.quantization_config  # transformers must not try to quantize the empty model itself
    shards = shard_files(model_dir)
    qnames = set(quantized_names(shards))  # every header read (truncated files found) before any weight
    model = empty_model(config, dtype)
    with discard_on_error(model):
        _load_layers(model, shards, qnames, spec, dtype, device, progress)
        finish_loading(model, getattr(config, "tie_word_embeddings", False), device, "checkpoint")
    model.config.quantization_config = qc
    no_experts_switch(model)
    return model.eval()


def _load_layers(model: nn.Module, shards, qnames, spec: dict, dtype: torch.dtype, device, progress: bool) -> None:
    """Stream ``shards`` into ``model``: quantized layers prepacked as they complete, the rest set."""
    from safetensors import safe_open
    from tqdm import tqdm

    # Quantized layers keep 16-bit scales; a float32 model (CPU reference runs) uses float16 ones.
    kdtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
    collectors: Dict[str, ExpertCollector] = {}  # experts module path -> its per-expert layers so far
    expert_of: Dict[str, tuple] = {}  # checkpoint layer name -> (experts path, expert, role)
    for name in sorted(qnames):
        where = expert_name(name, model)
        if where is not None:
            expert_of[name] = where
            if where[0] not in collectors:
                collectors[where[0]] = ExpertCollector(model.get_submodule(where[0]), spec, kdtype)
    for name in qnames - set(expert_of):
        lin = model.get_submodule(name)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"checkpoint: {name}.qweight belongs to a {type(lin).__name__}, not an nn.Linear")
        set_submodule(model, name, QuantLinear(lin.in_features, lin.out_features, bits=spec["bits"],
                                                group_size=spec["group_size"], bias=lin.bias is not None,
                                                zero_mode="sym" if spec["symmetric"] else "int",
                                                act_order=spec["act_order"], format=spec["format"],
                                                dtype=kdtype, device="meta"))
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    bar = tqdm(total=len(qnames), desc="load + prepack", unit="layer", disable=not progress)
    for path in shards:
        with reading(path), safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():
                owner, _, leaf = key.rpartition(".")
                if owner in qnames and leaf in SUFFIXES:
                    pending.setdefault(owner, {})[leaf] = f.get_tensor(key)
                else:
                    t = f.get_tensor(key)
                    set_tensor(model, key, t.to(dtype) if t.is_floating_point() else t)
        for owner in [o for o, parts in pending.items() if "qweight" in parts and "scales" in parts
                      and ("qzeros" in parts or spec["symmetric"])]:
            parts = pending.pop(owner)
            try:
                if owner in expert_of:
                    where, e, role = expert_of[owner]
                    collectors[where].add(e, role, parts, owner)
                    if collectors[where].complete():
                        set_submodule(model, where, collectors.pop(where).build())
                else:
                    scales = parts["scales"]
                    new = QuantLinear.from_checkpoint(
                        parts["qweight"], scales.to(kdtype) if scales.is_floating_point() else scales,
                        None if spec["symmetric"] else parts["qzeros"], parts.get("bias"), format=spec["format"],
                        bits=spec["bits"], group_size=spec["group_size"],
                        g_idx=parts.get("g_idx") if spec["act_order"] else None, dtype=kdtype)
                    set_submodule(model, owner, new)
            except (ValueError, TypeError) as err:  # the layer's tensors broke a rule: name file and layer
                raise (TypeError if isinstance(err, TypeError) else ValueError)(f"{path}: {owner}: {err}") from None
            bar.update()
    bar.close()
    if pending:
        raise ValueError(f"checkpoint: incomplete quantized layers {sorted(pending)[:5]} (missing qweight/scales/qzeros)")
    if collectors:
        raise ValueError(f"checkpoint: experts modules {sorted(collectors)[:3]} lack some experts' layers "
                         "(every expert needs gate, up and down)")
