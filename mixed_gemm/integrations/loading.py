"""What every checkpoint loader (AWQ/GPTQ safetensors, hqq, GGUF, tensor-parallel) shares: the
check of its arguments, an empty model of a config on the meta device, setting its submodules and
tensors by dotted name, the safetensors shards of a directory and their headers, and the last step
that ties, checks and materializes.

A checkpoint is data: every defect found while reading it (a truncated or corrupt file, a shard the
index lists but the directory lacks, a tensor of the wrong shape, dtype or values) is a ValueError
naming the file and the key, and a failed load leaves nothing on the device (:func:`discard_on_error`)."""
from __future__ import annotations

import contextlib
import json
import traceback
from pathlib import Path
from typing import List

import torch
from torch import nn

LOAD_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_load_args(model_dir, dtype, device) -> Path:
    """``model_dir`` an existing directory, ``dtype`` a model dtype, ``device`` a device; returns the path."""
    if dtype not in LOAD_DTYPES:
        raise TypeError(f"dtype: expected torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: expected a torch device, got {device!r} ({e})") from None
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ValueError(f"model_dir: {model_dir} is not a directory")
    return model_dir


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def shard_files(model_dir: Path):
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            files = list(dict.fromkeys(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index}: not a safetensors index (a JSON object with a weight_map): {e!r}") from None
        shards = [model_dir / f for f in files]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise ValueError(f"{index}: lists shards missing from {model_dir}: {missing}")
        return shards
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"model_dir: no model.safetensors or model.safetensors.index.json in {model_dir}")


@contextlib.contextmanager
def reading(path):
    """Errors opening or reading the safetensors file ``path`` (truncated, corrupt, unreadable) as
    a ValueError naming it."""
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None


def quantized_names(shards) -> List[str]:
    """Modules with a ``.qweight`` in any shard (reads the headers only, which also finds truncated
    files: the header's offsets must cover the file)."""
    from safetensors import safe_open

    names = []
    for path in shards:
        with reading(path), safe_open(str(path), framework="pt") as f:
            names += [key[: -len(".qweight")] for key in f.keys() if key.endswith(".qweight")]
    return names


def _discard(model: nn.Module) -> None:
    """Drop every tensor and submodule of a model a load gave up on (its device memory is freed)."""
    for mod in list(model.modules()):
        mod._parameters.clear()
        mod._buffers.clear()
        mod._modules.clear()


@contextlib.contextmanager
def discard_on_error(model: nn.Module):
    """On an error inside, empty ``model`` and clear the locals of the frames the exception (and the
    ones it chains) still holds, so that nothing half-loaded stays on the device while the caller
    holds the exception."""
    try:
        yield
    except BaseException as e:
        _discard(model)
        seen = set()
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            traceback.clear_frames(e.__traceback__)
            e = e.__cause__ or e.__context__
        raise


def empty_model(config, dtype: torch.dtype):
    """The model of ``config`` on the meta device: no memory for weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype)


def set_tensor(model: nn.Module, key: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = key.rpartition(".")
    try:
        owner = model.get_submodule(owner_name) if owner_name else model
    except AttributeError:
        raise ValueError(f"checkpoint: tensor {key!r} has no place in the model (no module {owner_name!r})") from None
    slots = owner._parameters if leaf in owner._parameters else owner._buffers if leaf in owner._buffers else None
    if slots is None:
        raise ValueError(f"checkpoint: tensor {key!r} has no place in the model")
    if slots[leaf] is not None and tuple(slots[leaf].shape) != tuple(value.shape):
        raise ValueError(f"checkpoint: tensor {key!r} expected shape {tuple(slots[leaf].shape)} (the model's), "
                         f"got {tuple(value.shape)}")
    slots[leaf] = nn.Parameter(value, requires_grad=False) if slots is owner._parameters else value


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
