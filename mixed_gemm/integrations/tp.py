"""Tensor-parallel quantized models: every rank builds the model on the meta device, reads only its
slices of the quantized projections from the safetensors shards, prepacks them on its GPU, and the
row-parallel layers all-reduce: our one-shot kernels over peer-mapped buffers for decode-sized
messages between NVLink/P2P-connected GPUs of one node, NCCL otherwise (gloo on the CPU; see
:mod:`mixed_gemm.ops.allreduce`, ``MIXED_GEMM_ALLREDUCE=nccl`` for NCCL throughout).

The plan is servers' (vLLM, SGLang, Megatron) for Llama-, Mistral- and Qwen2-family decoders:
``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` column-parallel (attention heads and
MLP columns split evenly: rank ``r`` holds heads ``[r H/tp, (r+1) H/tp)`` and KV heads likewise),
``o_proj`` and ``down_proj`` row-parallel (all-reduce after). Embeddings, norms and ``lm_head`` are
replicated (each rank computes the same logits). The cut of each projection's tensors:
:mod:`mixed_gemm.integrations.shard`. ``fuse_projections`` works per rank afterwards (q_r|k_r|v_r,
gate_r|up_r). The attention modules keep the config's head counts and infer local heads from the
projections' widths (transformers reshapes to ``(-1, head_dim)``); a static KV cache sized from the
config is therefore not supported under TP (the dynamic cache and ``use_cache=False`` are).

Usage, one process per GPU (``torchrun --nproc-per-node 2 script.py``; importing
:mod:`mixed_gemm.nn.parallel` first sets ``NCCL_NVLS_ENABLE=0``: no NVLink multicast)::

    import mixed_gemm.integrations.tp                                     # before NCCL starts
    torch.distributed.init_process_group("nccl")
    rank = torch.distributed.get_rank()
    torch.cuda.set_device(rank)
    model = load_quantized_tp("Llama-3-70B-AWQ", device=f"cuda:{rank}")   # this rank's shards
    fuse_projections(model)                                              # per rank
    fuse_all_reduce_norms(model)   # all-reduce + skip + next RMSNorm as one kernel (integrations.tp_fuse)
    logits = model(ids.to(model.device)).logits                         # the same on every rank
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..nn import QuantLinear
from ..nn.parallel import check_tp_rank, prepare_all_reduce
from .shard import checkpoint_dims, check_shardable, shard_linear
from .loading import (check_load_args, discard_on_error, empty_model, finish_loading, quantized_names, reading,
                      set_submodule, set_tensor, shard_files)
from .transformers import read_config

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
LEAVES = ("qweight", "scales", "qzeros", "g_idx", "bias")


def parallel_style(name: str) -> Optional[str]:
    """``"column"``, ``"row"`` or ``None`` (replicated) for a module name, by its last component."""
    leaf = name.rpartition(".")[2]
    return "column" if leaf in COLUMN_PARALLEL else "row" if leaf in ROW_PARALLEL else None


def tp_rank_and_size(tp_rank: Optional[int], tp_size: Optional[int], group=None) -> Tuple[int, int]:
    """The given ``tp_rank``/``tp_size``, else the process group's (``torch.distributed``)."""
    if tp_rank is None or tp_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("tp_rank, tp_size: give both, or initialize torch.distributed first "
                             "(init_process_group) so they come from the process group")
        tp_rank = dist.get_rank(group) if tp_rank is None else tp_rank
        tp_size = dist.get_world_size(group) if tp_size is None else tp_size
    check_tp_rank(tp_rank, tp_size)
    return tp_rank, tp_size


def check_tp_config(config, tp_size: int) -> None:
    """Attention heads and KV heads split evenly over the ranks (servers replicate KV heads when
    ``tp_size`` exceeds them; not done here)."""
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if heads is not None and heads % tp_size:
            raise ValueError(f"tp_size: column-parallel attention splits {field}={heads} evenly; it must be a "
                             f"multiple of tp_size={tp_size}")


def shard_projections(model: nn.Module, tensors: Callable[[str], Dict[str, Any]], names: Iterable[str], *,
                      spec: dict, tp_rank: int, tp_size: int, group=None, dtype: torch.dtype = torch.float16,
                      device="cuda", sliced: bool = False, progress: bool = False) -> nn.Module:
    """Replace each ``nn.Linear`` named in ``names`` (on the meta device or not) by this rank's
    parallel layer (:func:`parallel_style`; others by a replicated :class:`QuantLinear`).

    ``tensors(name)`` returns the module's checkpoint tensors (``qweight``, ``scales``, ``qzeros``,
    ``g_idx``, ``bias``; torch tensors or safetensors slices), whole (``sliced=False``: only this
    rank's part is read) or this rank's slices (``sliced=True``, :func:`~.shard.rank_shard`).
    ``spec``: as :func:`~.transformers.parse_quant_config` returns (``format``, ``bits``,
    ``group_size``, ``symmetric``, ``act_order``). Returns ``model``."""
    from tqdm import tqdm

    tp_rank, tp_size = tp_rank_and_size(tp_rank, tp_size, group)
    kdtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
    names = list(names)
    for name in tqdm(names, desc=f"rank {tp_rank}: shard + prepack", unit="layer", disable=not progress):
        lin = model.get_submodule(name)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"{name}: expected an nn.Linear to replace, got a {type(lin).__name__}")
        parts = tensors(name)
        zeros = None if spec["symmetric"] else parts["qzeros"]
        g_idx = parts.get("g_idx") if spec["act_order"] else None
        kw = dict(format=spec["format"], bits=spec["bits"], group_size=spec["group_size"], g_idx=g_idx,
                  zero_mode=spec.get("zero_mode", "int"), dtype=kdtype, device=device)
        style = parallel_style(name)
        if style is None:  # replicated: the whole layer on every rank
            read = lambda t: None if t is None else t[:].to(device)  # noqa: E731
            kw.update(g_idx=read(g_idx), device=None)
            new = QuantLinear.from_checkpoint(read(parts["qweight"]), read(parts["scales"]), read(zeros),
                                              read(parts.get("bias")), **{k: v for k, v in kw.items() if k != "device"})
        else:
            new = shard_linear(parts["qweight"], parts["scales"], zeros, parts.get("bias"), style=style,
                               tp_rank=tp_rank, tp_size=tp_size, sliced=sliced, group=group, **kw)
        set_submodule(model, name, new)
    return model


def _check_shapes(handles: Dict[str, Any], names, spec: dict, tp_size: int) -> None:
    """Every projection's rules from the safetensors headers, before any weight is read."""
    for name in names:
        style = parallel_style(name)
        if style is None:
            continue
        qweight, scales = handles[f"{name}.qweight"], handles[f"{name}.scales"]
        n, k = checkpoint_dims(qweight, scales, spec["format"], spec["bits"])
        try:
            check_shardable(n, k, style=style, tp_size=tp_size, format=spec["format"], bits=spec["bits"],
                            group_size=spec["group_size"], act_order=spec["act_order"],
                            has_zeros=not spec["symmetric"])
        except ValueError as e:
            raise ValueError(f"{name} ({style}-parallel, N={n}, K={k}): {e}") from None


def load_quantized_tp(model_dir, *, tp_rank: Optional[int] = None, tp_size: Optional[int] = None, group=None,
                      dtype: torch.dtype = torch.float16, device="cuda", progress: bool = False) -> nn.Module:
    """This rank's part of an AutoAWQ / GPTQ checkpoint (the contract of
    :func:`~mixed_gemm.integrations.transformers.load_quantized`) as a tensor-parallel model in eval
    mode on ``device``: the model is built on the meta device, each quantized projection's slices
    for this rank are read from the safetensors shards (never a whole projection, except the
    replicated scales of act-order row-parallel layers) and prepacked on ``device``; the other
    tensors are read whole (replicated). ``tp_rank``/``tp_size`` default to ``group``'s (the
    default process group's) rank and size. All rules are checked on the headers first. On CUDA
    the all-reduce's buffers and kernels are set up here (every rank calls this together)."""
    tp_rank, tp_size = tp_rank_and_size(tp_rank, tp_size, group)
    model_dir = check_load_args(model_dir, dtype, device)
    config, qc, spec = read_config(model_dir)
    check_tp_config(config, tp_size)
    del config.quantization_config  # transformers must not try to quantize the empty model itself
    shards = shard_files(model_dir)
    qnames = sorted(set(quantized_names(shards)))  # every header read (truncated files found) first
    model = empty_model(config, dtype)
    with discard_on_error(model):
        _load_rank(model, shards, qnames, spec, tp_rank=tp_rank, tp_size=tp_size, group=group, dtype=dtype,
                   device=device, progress=progress)
        finish_loading(model, getattr(config, "tie_word_embeddings", False), device, "checkpoint")
    model.config.quantization_config = qc
    if tp_size > 1 and torch.device(device).type == "cuda":
        prepare_all_reduce(group, device, dtypes=(dtype,))  # collective, here rather than in a forward
    return model.eval()


def _load_rank(model: nn.Module, shards, qnames, spec: dict, *, tp_rank: int, tp_size: int, group, dtype, device,
               progress: bool) -> None:
    """This rank's slices of ``shards`` into ``model`` (headers checked first, then read)."""
    from safetensors import safe_open
    from tqdm import tqdm

    with contextlib.ExitStack() as stack:
        files = {p: stack.enter_context(safe_open(str(p), framework="pt", device="cpu")) for p in shards}
        handles, where = {}, {}
        for path, f in files.items():
            for key in f.keys():
                handles[key], where[key] = f.get_slice(key), path
        for name in qnames:
            missing = [leaf for leaf in ("scales",) + (() if spec["symmetric"] else ("qzeros",))
                       if f"{name}.{leaf}" not in handles]
            if missing:
                raise ValueError(f"checkpoint: quantized layer {name} lacks {[f'{name}.{m}' for m in missing]}")
        _check_shapes(handles, qnames, spec, tp_size)
        for name, mod in model.named_modules():
            if parallel_style(name) is not None and isinstance(mod, nn.Linear) and name not in qnames:
                raise ValueError(f"checkpoint: {name} is not quantized; tensor-parallel loading shards the "
                                 f"quantized projections (add it to the quantized layers or load without TP)")
        owned = {f"{n}.{leaf}" for n in qnames for leaf in LEAVES}
        for key, h in handles.items():  # replicated tensors: read whole, once
            if key not in owned:
                with reading(where[key]):
                    t = h[:].to(device)
                set_tensor(model, key, t.to(dtype) if t.is_floating_point() else t)

        def tensors(name):
            return {leaf: handles[f"{name}.{leaf}"] for leaf in LEAVES if f"{name}.{leaf}" in handles}

        bar = tqdm(qnames, desc=f"rank {tp_rank}: shard + prepack", unit="layer", disable=not progress)
        for name in bar:  # one at a time, so that an error names the layer and its file
            try:
                shard_projections(model, tensors, [name], spec=spec, tp_rank=tp_rank, tp_size=tp_size, group=group,
                                  dtype=dtype, device=device, progress=False)
            except (ValueError, TypeError) as err:
                raise (TypeError if isinstance(err, TypeError) else ValueError)(
                    f"{where[name + '.qweight']}: {name}: {err}") from None
