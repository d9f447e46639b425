"""Problem sets: linear-layer shapes of common models, M buckets, MoE layer shapes, and ``N:K``
parsing."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

# (layer, N, K) of each model's linear layers, fused as inference servers run them:
# q/k/v as one projection, gate/up as one.
MODELS: Dict[str, List[Tuple[str, int, int]]] = {
    # hidden 4096, 32 heads / 8 KV heads of 128, intermediate 14336
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
    # hidden 8192, 64 heads / 8 KV heads of 128, intermediate 28672
    "llama3-70b": [("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 57344, 8192), ("down", 8192, 28672)],
    # hidden 3584, 28 heads / 4 KV heads of 128, intermediate 18944
    "qwen2.5-7b": [("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584), ("down", 3584, 18944)],
    # hidden 4096, 32 heads / 8 KV heads of 128, intermediate 14336 (the shapes of Llama-3-8B)
    "mistral-7b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
    # The same models as transformers runs them without fuse_projections: q, k/v and gate/up separately.
    "llama3-8b-unfused": [("q", 4096, 4096), ("k_v", 1024, 4096), ("gate/up", 14336, 4096)],
    "llama3-70b-unfused": [("q", 8192, 8192), ("k_v", 1024, 8192), ("gate/up", 28672, 8192)],
    "qwen2.5-7b-unfused": [("q", 3584, 3584), ("k_v", 512, 3584), ("gate/up", 18944, 3584)],
    "mistral-7b-unfused": [("q", 4096, 4096), ("k_v", 1024, 4096), ("gate/up", 14336, 4096)],
    # One rank's shards of Llama-3-70B at tensor parallel 2 (integrations.tp): q|k|v and gate|up
    # column-parallel (N halved), o and down row-parallel (K halved).
    "llama3-70b-tp2": [("qkv", 5120, 8192), ("o", 8192, 4096), ("gate_up", 28672, 8192), ("down", 8192, 14336)],
}
DEFAULT_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


# One MoE layer of each preset: experts, routed per token, hidden size, expert intermediate size.
@dataclass(frozen=True)
class MoeShape:
    experts: int
    top_k: int
    hidden: int
    inter: int


MOE_MODELS = {
    "mixtral-8x7b": MoeShape(8, 2, 4096, 14336),
    "qwen3-30b-a3b": MoeShape(128, 8, 2048, 768),
    "deepseek-v2-lite": MoeShape(64, 6, 2048, 1408),
}


def parse_ints(text: str, what: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what}: expected positive integers, got {text!r}")
    return values


def parse_shapes(text: str) -> List[Tuple[str, int, int]]:
    """``"6144:4096,4096:4096"`` -> [("6144x4096", 6144, 4096), ...]."""
    shapes = []
    for item in text.split(","):
        n, sep, k = item.strip().partition(":")
        if not sep or not n.isdigit() or not k.isdigit() or int(n) < 1 or int(k) < 1:
            raise ValueError(f"--shapes: expected N:K pairs like 4096:4096, got {item!r}")
        shapes.append((f"{n}x{k}", int(n), int(k)))
    return shapes


def resolve(models: str = "", shapes: str = "") -> List[Tuple[str, int, int]]:
    """(label, N, K) for ``--model a,b`` and/or ``--shapes N:K,...``; duplicates (same N, K) dropped."""
    out: List[Tuple[str, int, int]] = []
    for name in [m for m in models.split(",") if m]:
        if name not in MODELS:
            raise ValueError(f"--model: unknown preset {name!r}; choose from {', '.join(MODELS)}")
        out += [(f"{name}/{layer}", n, k) for layer, n, k in MODELS[name]]
    if shapes:
        out += parse_shapes(shapes)
    seen, unique = set(), []
    for label, n, k in out:
        if (n, k) not in seen:
            seen.add((n, k))
            unique.append((label, n, k))
    return unique
