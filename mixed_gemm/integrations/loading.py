"""What every checkpoint loader (AWQ/GPTQ safetensors, hqq, GGUF, tensor-parallel) shares: an empty
model of a config on the meta device, setting its submodules and tensors by dotted name, the
safetensors shards of a directory, and the last step that ties, checks and materializes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

import torch
from torch import nn


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def shard_files(model_dir: Path):
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return [model_dir / f for f in dict.fromkeys(json.loads(index.read_text())["weight_map"].values())]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"model_dir: no model.safetensors or model.safetensors.index.json in {model_dir}")


def quantized_names(shards) -> List[str]:
    """Modules with a ``.qweight`` in any shard (reads the headers only)."""
    from safetensors import safe_open

    names = []
    for path in shards:
        with safe_open(str(path), framework="pt") as f:
            names += [key[: -len(".qweight")] for key in f.keys() if key.endswith(".qweight")]
    return names


def empty_model(config, dtype: torch.dtype):
    """The model of ``config`` on the meta device: no memory for weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype)


def set_tensor(model: nn.Module, key: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = key.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value
    else:
        raise KeyError(f"checkpoint tensor {key!r} has no place in the model")


def materialize(model: nn.Module, device) -> None:
    """Give parameters/buffers still on the meta device real (uninitialized) memory, and rebuild
    non-persistent buffers (rotary ``inv_freq``) by constructing their module again on ``device``."""
    for name, mod in model.named_modules():
        for leaf, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                mod._parameters[leaf] = nn.Parameter(torch.empty_like(p, device=device), requires_grad=False)
        transient = [b for b in mod._buffers if b in mod._non_persistent_buffers_set and mod._buffers[b] is not None
                     and mod._buffers[b].is_meta]
        if transient:
            if not hasattr(mod, "config"):
                raise RuntimeError(f"{name}: cannot rebuild non-persistent buffers {transient} (no config)")
            with torch.device(device):
                fresh = type(mod)(mod.config)
            for b in transient:
                mod._buffers[b] = fresh._buffers[b]
            for attr, val in vars(fresh).items():  # e.g. attention_scaling
                if not attr.startswith("_") and not isinstance(val, (torch.Tensor, nn.Module)):
                    setattr(mod, attr, val)
        for leaf, t in list(mod._buffers.items()):
            if t is not None and t.is_meta:
                mod._buffers[leaf] = torch.empty_like(t, device=device)


def finish_loading(model: nn.Module, tie: bool, device, source: str) -> None:
    """After a loader set every tensor it has: tie the embeddings (``tie``), refuse a model with
    tensors still on the meta device (naming them and ``source``), materialize the rest."""
    if tie:
        model.tie_weights()
    missing = [k for k, v in model.state_dict().items() if v.is_meta]
    if missing:
        raise ValueError(f"{source}: no tensors for {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    materialize(model, device)
