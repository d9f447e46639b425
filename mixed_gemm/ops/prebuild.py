"""``prebuild``: compile, several nvcc at once, the kernels that calls on some weights will select,
before the first call needs them.

A kernel built on first use costs nvcc's seconds inside that call (a minute for an sm90a kernel
library); a model's first forward, a benchmark's first timing or one rank of a tensor-parallel
group (whose peer then waits at the all-reduce) pays them one kernel after another. ``prebuild``
asks selection what each weight runs at each M (as :func:`~mixed_gemm.explain` does: override,
profile, heuristics), adds the row-parallel fused gemv all-reduce kernels where a group of
``world`` ranks would run them and the all-reduce kernels of the activations' dtypes, and builds
them side by side (:func:`mixed_gemm.compile.build_specs`); kernels already in the cache or in an
installed kernel package cost a lookup.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import torch

from ..compile import blocking, build_specs
from ..kernels.allreduce import ALGOS, GEMM_FUSED_MAX_M, AllReduceConfig
from ..kernels.allreduce import FAMILY as ALL_REDUCE
from ..kernels.allreduce.gemv import FAMILY as GEMV_ALL_REDUCE
from ..kernels.allreduce.gemv import GemvAllReduceConfig, gemv_config_for
from ..kernels.base import sm_count
from ..kernels.gemv import FAMILY as GEMV
from ..select import m_bucket, selected
from .matmul import problem
from .packed import PackedWeight

_DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


def selection_specs(w: PackedWeight, ms: Iterable[int]) -> List:
    """The build specs of what ``matmul`` selects for ``m`` rows times ``w``, for each ``m``."""
    specs = []
    for bucket in sorted({m_bucket(m) for m in ms}):
        choice = selected(w.signature, bucket, problem(w, bucket), w.device.index)
        specs.append(choice.family.build_spec(choice.config))
    return specs


def gemm_all_reduce_specs(w: PackedWeight, ms: Iterable[int], world: int) -> List:
    """The fused gemv all-reduce kernels (and their plain gemv twins) of a row-parallel shard ``w``
    over ``world`` ranks, at each ``m`` within the fused kernels' rows where selection runs a gemv
    (elsewhere the fused path runs GEMM + all-reduce): the configuration the fused path picks
    (:func:`mixed_gemm.kernels.allreduce.gemv.gemv_config_for`)."""
    specs = []
    for bucket in sorted({m_bucket(m) for m in ms if m <= GEMM_FUSED_MAX_M}):
        prob = problem(w, bucket)
        choice = selected(w.signature, bucket, prob, w.device.index)
        if choice.family.name != "gemv":  # the fused path runs GEMM + all-reduce there
            continue
        gemv = gemv_config_for(prob, sm_count(w.device.index), choice.config)
        if gemv is not None:
            specs += [GEMV_ALL_REDUCE.build_spec(GemvAllReduceConfig(gemv, world)), GEMV.build_spec(gemv)]
    return specs


def all_reduce_specs(dtypes: Iterable[torch.dtype], world: int) -> List:
    """Every all-reduce kernel (each algorithm) of ``world`` ranks for each activation dtype."""
    names = []
    for dtype in dtypes:
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtypes: expected float16, bfloat16 or float32, got {dtype}")
        names.append(_DTYPE_NAMES[dtype])
    return [ALL_REDUCE.build_spec(AllReduceConfig(algo, name, world)) for name in dict.fromkeys(names)
            for algo in ALGOS]


def prebuild(weights: Sequence[PackedWeight], ms: Iterable[int], *, world: Optional[int] = None,
             row_parallel: Sequence[PackedWeight] = (), jobs: Optional[int] = None) -> int:
    """Build the kernels ``matmul`` selects for every weight in ``weights`` at every ``m`` in
    ``ms``; with ``world`` (the tensor-parallel group's size, >= 2), also the fused gemv
    all-reduce kernels of the ``row_parallel`` shards and the all-reduce kernels of their dtypes.
    Returns the number of distinct kernels. Raises :class:`mixed_gemm.compile.BuildError` if one
    fails to build (or the JIT is off and no package holds it)."""
    ms = list(ms)
    if not ms or any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in ms):
        raise ValueError(f"ms: expected row counts >= 1, got {ms!r}")
    if world is not None and (not isinstance(world, int) or world < 2):
        raise ValueError(f"world: expected a group size >= 2 (or None), got {world!r}")
    if row_parallel and world is None:
        raise ValueError("row_parallel: the fused all-reduce kernels need world, the group's size")
    for name, ws in (("weights", weights), ("row_parallel", row_parallel)):
        for w in ws:
            if not isinstance(w, PackedWeight):
                raise TypeError(f"{name}: expected PackedWeights, got {type(w).__name__}")
            if w.device.type != "cuda":
                raise ValueError(f"{name}: weights must be on a CUDA device (selection depends on the GPU), got {w.device}")
    specs = [s for w in list(weights) + list(row_parallel) for s in selection_specs(w, ms)]
    if world is not None:
        specs += [s for w in row_parallel for s in gemm_all_reduce_specs(w, ms, world)]
        specs += all_reduce_specs({w.dtype for w in row_parallel} or {torch.float16}, world)
    with blocking():
        return len(build_specs(specs, jobs=jobs))
