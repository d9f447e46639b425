"""Mixture-of-experts layers in AWQ/GPTQ checkpoints.

AutoAWQ and GPTQ quantize each expert's linear layers on their own, so a checkpoint holds per-expert
modules: ``<block>.experts.<e>.{gate_proj, up_proj, down_proj}`` (Qwen2/3-MoE, DeepSeek-V2) or
Mixtral's original ``<block>.experts.<e>.{w1, w3, w2}`` (gate, up, down) under
``block_sparse_moe``, each with ``qweight``/``scales``/``qzeros``. transformers 5 keeps all
experts of a block in one module, ``<...>.mlp.experts``, which :class:`~mixed_gemm.nn.QuantExperts`
replaces: loading collects every expert's three projections, unpacks them to canonical codes and
stacks them (gate rows, then up rows, as ``gate_up_proj``); saving writes them back per expert
with the gate_proj/up_proj/down_proj names.
"""
from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ..formats import pack, unpack
from ..nn import QuantExperts, is_experts
from ..ops.experts import prepack_experts

_EXPERT = re.compile(r"^(?P<block>.+)\.experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)$")
_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def expert_name(name: str, model: nn.Module) -> Optional[Tuple[str, int, str]]:
    """``(experts module path in model, expert index, "gate"|"up"|"down")`` for a checkpoint's
    per-expert layer name, or ``None`` when ``name`` is not one. Mixtral's ``block_sparse_moe``
    maps to the ``mlp`` that transformers 5 names it."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    block = m["block"]
    if block.endswith(".block_sparse_moe"):
        try:
            model.get_submodule(block)
        except AttributeError:
            block = block[: -len("block_sparse_moe")] + "mlp"
    path = f"{block}.experts"
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    if not is_experts(module):
        raise ValueError(f"checkpoint: {name} is an expert's layer, but {path} is a {type(module).__name__}, not "
                         "a transformers experts module (gate_up_proj, down_proj)")
    return path, int(m["e"]), _ROLE[m["proj"]]


class ExpertCollector:
    """Gathers the per-expert layers of one experts module as they stream in, and builds its
    :class:`QuantExperts` once all ``E`` experts' three projections are there."""

    def __init__(self, module: nn.Module, spec: dict, dtype: torch.dtype):
        self.num_experts = module.gate_up_proj.shape[0]
        self.spec, self.dtype = spec, dtype
        self.parts: Dict[Tuple[int, str], tuple] = {}

    def add(self, e: int, role: str, tensors: Dict[str, torch.Tensor], name: str) -> None:
        spec = self.spec
        if spec["act_order"] and "g_idx" in tensors:
            raise ValueError(f"checkpoint: {name} is an act-order (desc_act) expert layer; stacked experts take "
                             "contiguous groups only")
        zeros = None if spec["symmetric"] else tensors["qzeros"]
        self.parts[(e, role)] = unpack(tensors["qweight"], tensors["scales"], zeros, format=spec["format"],
                                       bits=spec["bits"], group_size=spec["group_size"])

    def complete(self) -> bool:
        return len(self.parts) == 3 * self.num_experts

    def build(self) -> QuantExperts:
        def field(rows, i):  # canonical field i of every expert, its roles' rows concatenated
            return torch.stack([torch.cat([self.parts[(e, r)][i] for r in rows]) for e in range(self.num_experts)])

        def stacked(rows):
            z = None if self.spec["symmetric"] else field(rows, 2)
            return prepack_experts(field(rows, 0), field(rows, 1).to(self.dtype), z, bits=self.spec["bits"],
                                   group_size=self.spec["group_size"], dtype=self.dtype, gate_up=len(rows) == 2)

        return QuantExperts(stacked(("gate", "up")), stacked(("down",)), group_size=self.spec["group_size"])


def expert_tensors(path: str, module: QuantExperts, *, format: str) -> Dict[str, torch.Tensor]:
    """The checkpoint tensors of ``module`` (at ``path``), per expert: ``{path}.{e}.gate_proj.qweight``,
    ``.scales``, ``.qzeros`` (GPTQ: ``.g_idx`` too), likewise ``up_proj`` and ``down_proj``."""
    from ..formats import make_g_idx

    w13, w2 = module.packed()
    inter = w2.k
    out: Dict[str, torch.Tensor] = {}
    for e in range(w13.num_experts):
        q13, s13, z13 = w13.unpack_expert(e)  # gate rows, then up rows
        q2, s2, z2 = w2.unpack_expert(e)
        rows = {"gate_proj": slice(0, inter), "up_proj": slice(inter, 2 * inter)}
        layers = {name: (q13[r], s13[r], None if z13 is None else z13[r]) for name, r in rows.items()}
        layers["down_proj"] = (q2, s2, z2)
        for name, (q, s, z) in layers.items():
            group = module.group_size if module.group_size != -1 else q.shape[1]
            qweight, scales, qzeros = pack(q, s, z, format=format, bits=w13.bits, group_size=group)
            key = f"{path}.{e}.{name}"
            out[f"{key}.qweight"], out[f"{key}.scales"] = qweight, scales
            if qzeros is not None:
                out[f"{key}.qzeros"] = qzeros
            if format == "gptq":
                out[f"{key}.g_idx"] = make_g_idx(q.shape[1], group, device=q.device)
    return out
