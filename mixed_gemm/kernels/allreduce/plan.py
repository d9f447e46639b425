"""Which all-reduce a call runs: one of ours (one-shot, two-shot) or NCCL, from the message's size
and the group's size only (never from pointers or timings), so that every rank of a group, which
sees the same sizes, makes the same choice: a rank that ran another algorithm than its peers
would wait for them forever.

Modes (``MIXED_GEMM_ALLREDUCE``, or the layers' ``all_reduce`` argument): ``auto`` (the table
below), ``nccl`` (always NCCL: the A/B baseline), ``one_shot`` / ``two_shot`` (that algorithm
wherever ours can run at all), ``fused`` (the row-parallel GEMM fused with its all-reduce where
:func:`choose_gemm_fused` allows, ``auto`` for every other all-reduce). Measurements behind the
table: docs/notes/tensor-parallel-allreduce.md.
"""
from __future__ import annotations

from typing import Tuple

from .config import CHUNK, FUSED_ROW, MAX_CHUNKS, MAX_RANKS, VECTOR_BYTES

MODES = ("auto", "nccl", "one_shot", "two_shot", "fused")
NCCL = "nccl"
FUSED = "fused"
# The fused GEMM is a gemv kernel: up to 32 tokens where the weight has the sm90a copy (or is
# 1:2-sparse lowbit), 16 for the sm80-layout kernel, 8 for the other lowbit widths.
GEMM_FUSED_MAX_M = 32

# Largest message (bytes) one-shot takes in auto mode, by world size; two-shot above it. One-shot
# pushes the whole message to each of the W - 1 peers (W - 1 times its bytes out of each GPU),
# two-shot 2 (W - 1) / W times them but crosses two barriers: with two ranks both move the
# message once, so one-shot always wins there. The crossover for more ranks is estimated from
# NVLink bandwidth and one barrier's latency (not measured on 4 or 8 GPUs yet).
ONE_SHOT_MAX_BYTES = {2: None, 3: 512 << 10, 4: 256 << 10, 5: 128 << 10, 6: 128 << 10, 7: 128 << 10, 8: 128 << 10}


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`; ``ValueError`` naming the choices otherwise."""
    if mode not in MODES:
        raise ValueError(f"all_reduce: must be one of {MODES} (or set MIXED_GEMM_ALLREDUCE to one), got {mode!r}")
    return mode


def choose(nbytes: int, world_size: int, mode: str, slot_bytes: int) -> Tuple[str, str]:
    """``(algorithm, reason)``: ``"one_shot"``, ``"two_shot"`` or ``"nccl"`` for a message of
    ``nbytes`` over ``world_size`` ranks of a group whose buffers hold ``slot_bytes`` per slot."""
    check_mode(mode)
    if mode == NCCL:
        return NCCL, "NCCL forced (all_reduce='nccl' / MIXED_GEMM_ALLREDUCE=nccl)"
    if world_size not in ONE_SHOT_MAX_BYTES:
        return NCCL, f"{world_size} ranks: ours serves 2 to {max(ONE_SHOT_MAX_BYTES)}"
    if nbytes > slot_bytes:
        return NCCL, f"{nbytes} bytes: above the {slot_bytes}-byte buffers (MIXED_GEMM_ALLREDUCE_MAX_BYTES)"
    if mode not in ("auto", FUSED):
        return mode, f"{mode} forced"
    limit = ONE_SHOT_MAX_BYTES[world_size]
    if limit is None or nbytes <= limit:
        return "one_shot", "one-shot: a small message" if limit else "one-shot: two ranks move the message once either way"
    return "two_shot", f"two-shot: above {limit} bytes over {world_size} ranks"


def gemv_max_m(layout: str, bits: int) -> int:
    """The most rows of x a gemv kernel takes for a weight holding ``layout`` (``"sm80+sm90a"``...)."""
    layouts = layout.split("+")
    if "sm90a" in layouts:
        return GEMM_FUSED_MAX_M
    if "lowbit" in layouts:
        return GEMM_FUSED_MAX_M if bits == 7 else 8
    return 16 if "sm80" in layouts else 0


def choose_gemm_fused(m: int, n: int, world_size: int, dtype: str, layout: str, bits: int, mode: str,
                      slot_bytes: int) -> Tuple[bool, str]:
    """``(fused, reason)``: whether a row-parallel GEMM of ``m`` rows and ``n`` outputs runs fused
    with its all-reduce (one gemv kernel) rather than GEMM + all-reduce. From sizes and the weight's
    kind only (the same on every rank of a group: each holds a K slice of the same kind), so ranks
    agree; never from the kernel that selection picked, which is a per-rank choice."""
    check_mode(mode)
    if mode != FUSED:
        return False, f"GEMM + all-reduce (mode {mode!r}; the fused kernel is opt-in: 'fused')"
    if not 2 <= world_size <= MAX_RANKS:
        return False, f"{world_size} ranks: ours serves 2 to {MAX_RANKS}"
    if dtype not in ("f16", "bf16"):
        return False, f"{dtype}: the gemv kernels take f16 and bf16"
    most = gemv_max_m(layout, bits)
    if not 1 <= m <= most:
        return False, f"M={m}: the gemv kernels of a {layout} {bits}-bit weight take 1 to {most} rows"
    vec = VECTOR_BYTES // 2
    if n % vec or n > MAX_CHUNKS * CHUNK:
        return False, f"N={n}: the fused kernel takes multiples of {vec} up to {MAX_CHUNKS * CHUNK}"
    # A token's outputs take a fixed row of FUSED_ROW in the fused slots, whatever N (the
    # per-chunk parities need each chunk's own places: templates/allreduce/gemv_allreduce.cuh).
    if 2 * m * FUSED_ROW > slot_bytes:
        return False, (f"M={m}: the fused slots hold {FUSED_ROW} outputs per row, {2 * m * FUSED_ROW} bytes, above "
                       f"the {slot_bytes}-byte buffers (MIXED_GEMM_ALLREDUCE_MAX_BYTES)")
    return True, "GEMM fused with the all-reduce (gemv epilogue pushes, last grid row reduces)"
