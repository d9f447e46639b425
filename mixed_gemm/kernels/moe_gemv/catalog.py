"""The moe_gemv family's default catalog: the compiled identities ``mixed-gemm build --all``
precompiles and ``generated/`` shows. Kept small (every kernel in it is compiled): per activation
dtype and width, three pair-mode shapes per stage and one expert-mode shape per stage at 8 and 16
tokens, one persistent-mode shape per stage at 8 and 16 tokens, and the one-launch persistent kernel
(both stages, ``_pe1``) at 8 and 16 tokens; the pair-mode shapes again with deferred group
parameters (``_ds``: the mma path, for the large experts' one-token stream): 88 kernels. Profile
candidates besides (in the catalog so that ``build --all`` and the tests reach them, in a kernel
package only where a profile names them: ``MoeGemvFamily.packaged``): the deferred gate|up shapes
with the page touch before the main loop (``_tp``): 12 kernels; the deferred down shapes with the
K warps spread over top-k slots (``_sw``): 16 kernels."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from .config import MoeGemvConfig

# (stage, strips per warp, (warps along the outputs, warps along K), unroll) for int4; int8 halves
# the unroll (the same weight bytes in flight per warp). One token row per CTA (pair mode).
SHAPES = (
    # gate|up: a warp loads 2 x strips strips (gate and up) per atom column.
    ("w13", 2, (4, 1), 8),   # 128 h columns (256 weight rows) per CTA: 16 KB of int4 in flight per CTA step
    ("w13", 1, (4, 2), 8),   # 64 h columns, K split over 2 warps: twice the CTAs at T = 1
    # down: the top-k slots of a token are planes (or one CTA's loop, _kloop)
    ("w2", 2, (4, 2), 8),    # 128 y columns per CTA (gemv's m1_s2_w4x2_u8)
    ("w2", 1, (4, 2), 8),    # 64 y columns: more CTAs for H = 2048
    # 32 outputs per CTA, K over 4 warps: twice the CTAs again, each streaming a quarter of the K
    # range per warp (the small experts' one-token stages are latency-bound: more loads in flight)
    ("w13", 1, (2, 4), 8),
    ("w2", 1, (2, 4), 8),
)

# Slot-warps mode (``_sw``, the down projection, deferred group parameters): (stage, strips, warps,
# unroll) with the K warps spread over a token's top-k slots. 16 outputs per CTA (the most CTAs
# along H): 16 K warps hold 8 slots x 2 pieces (Qwen3-30B-A3B: 24 atoms a warp) or 2 slots x 8
# (Mixtral), 12 hold 6 x 2 (DeepSeek-V2-Lite), 8 one warp a slot; unroll 16 issues a small
# expert's piece in one or two steps.
SLOT_WARP_SHAPES = (
    ("w2", 1, (1, 16), 16),
    ("w2", 1, (1, 16), 8),
    ("w2", 1, (1, 12), 16),
    ("w2", 1, (1, 8), 16),
)

# Expert mode (by_expert): (stage, strips, warps, unroll, tokens), unroll halved for int8 likewise.
# 64 outputs per CTA and K split over two warps: grid.z is the experts (not the pairs), so the CTAs
# come from the rows; x is staged per warp (16 rows x 8 atoms = 4.25 KB), under 48 KB in all.
EXPERT_SHAPES = (
    ("w13", 1, (4, 2), 8, 8),
    ("w13", 1, (4, 2), 8, 16),
    ("w2", 1, (4, 2), 8, 8),
    ("w2", 1, (4, 2), 8, 16),
)


# Persistent mode: (stage, strips, warps, unroll, tokens), expert mode's shapes (its main loop):
# 64 outputs per CTA, K split over two warps. Unmeasured: the profiler's candidates add the 128-
# output CTAs (s2) at 8 tokens.
PERSISTENT_SHAPES = (
    ("w13", 1, (4, 2), 8, 8),
    ("w13", 1, (4, 2), 8, 16),
    ("w2", 1, (4, 2), 8, 8),
    ("w2", 1, (4, 2), 8, 16),
)


def _unroll(u: int, bits: int) -> int:
    """A shape's unroll for ``bits``: int8 halves int4's (the same weight bytes in flight per warp)."""
    return u if bits == 4 else max(1, u // 2)


def shapes_for(bits: int, stage: str = None):
    return [(st, s, w, _unroll(u, bits)) for st, s, w, u in SHAPES if stage in (None, st)]


def slot_warp_shapes_for(bits: int):
    return [(st, s, w, _unroll(u, bits)) for st, s, w, u in SLOT_WARP_SHAPES]


def expert_shapes_for(bits: int, stage: str = None, tokens: int = None):
    return [(st, s, w, _unroll(u, bits), t) for st, s, w, u, t in EXPERT_SHAPES
            if stage in (None, st) and tokens in (None, t)]


def persistent_shapes_for(bits: int, stage: str = None, tokens: int = None):
    return [(st, s, w, _unroll(u, bits), t) for st, s, w, u, t in PERSISTENT_SHAPES
            if stage in (None, st) and tokens in (None, t)]


def default_catalog() -> List[MoeGemvConfig]:
    pair = [MoeGemvConfig(dtype=d, bits=b, stage=st, strips=s, warps=w, unroll=u, deferred=ds)
            for ds in (False, True) for d in DTYPES for b in (4, 8) for st, s, w, u in shapes_for(b)]
    touch = [c.replace(touch_pages=True) for c in pair if c.deferred and c.stage == "w13"]
    slot_warps = [MoeGemvConfig(dtype=d, bits=b, stage=st, strips=s, warps=w, unroll=u, deferred=True, slot_warps=True)
                  for d in DTYPES for b in (4, 8) for st, s, w, u in slot_warp_shapes_for(b)]
    expert = [MoeGemvConfig(dtype=d, bits=b, stage=st, strips=s, warps=w, unroll=u, tokens=t, by_expert=True)
              for d in DTYPES for b in (4, 8) for st, s, w, u, t in expert_shapes_for(b)]
    persistent = [MoeGemvConfig(dtype=d, bits=b, stage=st, strips=s, warps=w, unroll=u, tokens=t, persistent=True)
                  for d in DTYPES for b in (4, 8) for st, s, w, u, t in persistent_shapes_for(b)]
    fused = [MoeGemvConfig(dtype=d, bits=b, stage=st, strips=s, warps=w, unroll=u, tokens=t, persistent=True, fused=True)
             for d in DTYPES for b in (4, 8) for st, s, w, u, t in persistent_shapes_for(b, "w13")]
    return pair + expert + persistent + fused + touch + slot_warps
