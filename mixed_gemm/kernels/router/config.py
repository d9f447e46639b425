"""``RouterConfig``: one fused top-k router kernel (templates/router/router.cuh) for one set of
element types (activations, router weight, logits, scores) and one CTA shape.

Compiled identity ``mg_router_<x>_w<w>_l<logits>_s<scores>_<warps>w_k<split>_t<tokens>``: ``warps``
warps a CTA, each expert's dot products split over ``split`` warps (along H), ``tokens`` tokens a CTA.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ..common import CUDA_ELEMENTS, ELEMENT_NAMES, OwnKernel, raise_on

# element name -> (C++ type, bytes); torch dtype name -> element name
ELEMENTS, TORCH_DTYPES = CUDA_ELEMENTS, ELEMENT_NAMES  # kernels/common.py
ACTIVATIONS = ("f16", "bf16")

# Mirrors of templates/router/router.cuh (rendered sources static_assert them).
MAX_EXPERTS = 256   # kRouterMaxExperts
MAX_TOP_K = 32      # kRouterMaxTopK
VECTOR = 8          # kRouterVector: H must be a multiple of it (16-byte loads)
UNROLL = 4          # kRouterUnroll

TOKENS = (1, 4, 8)
SPLITS = (1, 2, 4, 8)
WARPS = 8
# Above this many tokens a call runs the router in torch ops (cuBLAS reads the weight once for all
# rows; the fused kernel reads it once per token tile). H100, cold L2, the 8-token tile with its x
# rows staged (bench/results/h100-router.md): Qwen3-30B-A3B's router 19.3 against 26.9 µs at 128
# tokens, 27.6 against 27.2 at 256, 44.8 against 28.7 at 512; DeepSeek-V2-Lite's 14.3 against 27.8
# at 256.
MAX_TOKENS = 256
COUNTERS = MAX_TOKENS  # arrival counters a router module keeps: one per token tile, at most MAX_TOKENS tiles
# Shared-memory bytes a multi-token tile may stage its x rows in (tokens x hidden x 2): within every
# sm_80+ GPU's opt-in per block (99 KB on sm_86/sm_89; 163 KB A100, 227 KB H100).
MAX_STAGED = 96 * 1024


def constant_checks() -> List[Tuple[str, int]]:
    """``(C++ expression, Python value)`` pairs that must be equal."""
    return [("mixed_gemm::kRouterMaxExperts", MAX_EXPERTS), ("mixed_gemm::kRouterMaxTopK", MAX_TOP_K),
            ("mixed_gemm::kRouterVector", VECTOR), ("mixed_gemm::kRouterUnroll", UNROLL)]


@dataclass(frozen=True)
class RouterConfig(OwnKernel):
    """One router kernel: ``x`` activations, ``w`` router weight, ``logits`` and ``scores`` output
    elements; ``warps`` warps a CTA, ``split`` warps an expert, ``tokens`` tokens a CTA."""

    x: str = "f16"
    w: str = "f16"
    logits: str = "f16"
    scores: str = "f16"
    warps: int = WARPS
    split: int = 2
    tokens: int = 1

    family = "router"

    def __post_init__(self) -> None:
        raise_on([(self.x in ACTIVATIONS, f"x must be one of {ACTIVATIONS}"),
                  (self.w in ELEMENTS, f"w must be one of {tuple(ELEMENTS)}"),
                  (self.logits in ELEMENTS, f"logits must be one of {tuple(ELEMENTS)}"),
                  (self.scores in ELEMENTS, f"scores must be one of {tuple(ELEMENTS)}"),
                  (self.warps in (4, 8, 16), "warps must be 4, 8 or 16"),
                  (self.split in SPLITS and self.warps % self.split == 0,
                   f"split must be one of {SPLITS} and divide warps"),
                  (self.tokens in TOKENS, f"tokens must be one of {TOKENS}")],
                 "RouterConfig")

    @property
    def kernel_name(self) -> str:
        return (f"mg_router_{self.x}_w{self.w}_l{self.logits}_s{self.scores}_{self.warps}w_k{self.split}"
                f"_t{self.tokens}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def experts_per_cta(self) -> int:
        return self.warps // self.split

    def staged_bytes(self, hidden: int) -> int:
        """Dynamic shared memory of a launch: a multi-token tile's x rows (16-bit), else none."""
        return self.tokens * hidden * ELEMENTS[self.x][1] if self.tokens > 1 else 0

    def grid(self, tokens: int, experts: int) -> Tuple[int, int, int]:
        """Expert blocks x token tiles."""
        return -(-experts // self.experts_per_cta), -(-tokens // self.tokens), 1


# The one-token shape serves T tokens as T token tiles while the grid stays within this many CTAs
# (H100, bench/results/h100-router.md, staged tiles: DeepSeek-V2-Lite's router at 64 tokens, 4096
# one-token CTAs, 17.1 µs against 11.8 for the 8-token tile at 128 tokens; Mixtral's at 128 tokens,
# 1024 CTAs, 9.7 µs).
ONE_TOKEN_CTAS = 1024


def one_token(x: str, w: str, logits: str, scores: str) -> RouterConfig:
    """One token a CTA, one expert a CTA over all eight warps (the most CTAs in flight: measured
    fastest for Qwen3's, Mixtral's and DeepSeek's routers, 5.2-6.0 µs against 6.1-7.0 at the next
    split at one token)."""
    return RouterConfig(x=x, w=w, logits=logits, scores=scores, split=SPLITS[-1], tokens=1)


def tiled(x: str, w: str, logits: str, scores: str, tokens: int, hidden: int) -> RouterConfig:
    """Up to eight tokens a CTA (each weight vector read once for them; their x rows staged in
    shared memory within ``MAX_STAGED``), an expert's H split over enough warps that a lane's
    weight loads are in flight at once (``UNROLL`` 16-byte vectors: ~1024 elements a warp)."""
    tile = 4 if tokens <= 4 else 8
    while tile > 1 and tile * hidden * ELEMENTS[x][1] > MAX_STAGED:
        tile = 4 if tile == 8 else 1
    if tile == 1:
        return one_token(x, w, logits, scores)
    split = next((s for s in SPLITS if s * 32 * VECTOR * UNROLL >= hidden), SPLITS[-1])
    return RouterConfig(x=x, w=w, logits=logits, scores=scores, split=split, tokens=tile)


def choose(x: str, w: str, logits: str, scores: str, tokens: int, hidden: int, experts: int = 1) -> RouterConfig:
    """The kernel for a call: :func:`one_token` for one token, or T tokens whose T x E one-expert
    CTAs stay within ``ONE_TOKEN_CTAS``; :func:`tiled` above."""
    if tokens == 1 or tokens * experts <= ONE_TOKEN_CTAS:
        return one_token(x, w, logits, scores)
    return tiled(x, w, logits, scores, tokens, hidden)


def catalog() -> List[RouterConfig]:
    """What a kernel package ships: the element sets of the routers integrations.router serves
    (fp16/bf16 throughout; fp32 scores; fp32 weight and logits) at every CTA shape."""
    sets = [(a, a, a, a) for a in ACTIVATIONS] + [(a, a, a, "f32") for a in ACTIVATIONS] + \
           [(a, "f32", "f32", "f32") for a in ACTIVATIONS]
    return [RouterConfig(x=x, w=w, logits=lg, scores=s, split=k, tokens=t)
            for x, w, lg, s in sets for k in SPLITS for t in TOKENS]
