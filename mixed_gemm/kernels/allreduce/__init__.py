"""The ``allreduce`` family: the sum of a small message over the GPUs of one node, through
peer-mapped buffers (templates/allreduce/allreduce.cuh). Not a GEMM family: it follows the family
contract (a frozen config, its template, arch flags, ``can_implement``, a launcher on torch's
current stream) but is not in the GEMM registry (``kernels.FAMILIES``); the tensor-parallel
layers reach it through :mod:`mixed_gemm.ops.allreduce`, which owns the buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ...codegen import render_template
from ...runtime import get_module
from ..base import OK, SM80_UP_FLAGS, Family, Verdict
from .abi import ALLREDUCE_ARGS_BYTES, AllReduceArgs
from .config import (ALGOS, DATA_OFFSET, ELEMENTS, MAX_BLOCKS, MAX_RANKS, THREADS, TORCH_DTYPES, VECTOR_BYTES,
                     AllReduceConfig, buffer_bytes, constant_checks)
from .plan import FUSED, GEMM_FUSED_MAX_M, MODES, NCCL, ONE_SHOT_MAX_BYTES, check_mode, choose, choose_gemm_fused


@dataclass(frozen=True)
class AllReduceProblem:
    """One call as the kernels see it: ``numel`` values of ``dtype`` summed over ``world_size``
    ranks whose buffers hold ``slot_bytes`` per slot; for ``rms_norm``, ``rows`` x ``cols``."""

    numel: int
    dtype: str
    world_size: int
    slot_bytes: int
    rows: int = 1
    cols: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * ELEMENTS[self.dtype][1] if self.dtype in ELEMENTS else 0


class AllReduceFamily(Family):
    name = "allreduce"
    config_class = AllReduceConfig
    sets_layout = False
    # 16-byte vectors, bf16, ld.acquire/st.release.sys: sm_80 and later (PTX for newer GPUs).
    arch_flags = SM80_UP_FLAGS
    min_capability = (8, 0)

    def can_implement(self, config: AllReduceConfig, problem: AllReduceProblem) -> Verdict:
        if not isinstance(problem, AllReduceProblem):
            return False, f"{self.name} sums messages over ranks (an AllReduceProblem), not {type(problem).__name__}"
        if (config.dtype, config.world_size) != (problem.dtype, problem.world_size):
            return False, (f"{config.name} is for {config.dtype} over {config.world_size} ranks, the problem is "
                           f"{problem.dtype} over {problem.world_size}")
        if problem.nbytes > problem.slot_bytes:
            return False, f"{problem.nbytes} bytes do not fit the {problem.slot_bytes}-byte slots"
        if config.algo == "rms_norm":
            vec = config.vector_elements
            if problem.cols <= 0 or problem.cols % vec or problem.rows * problem.cols != problem.numel:
                return False, (f"rms_norm reads rows of whole 16-byte vectors: cols must be a positive multiple of "
                               f"{vec} and rows x cols = numel, got {problem.rows} x {problem.cols}, numel {problem.numel}")
        return OK

    def catalog(self) -> List[AllReduceConfig]:
        return []  # compiled on first use per (dtype, world size): seconds, no CUTLASS

    def render(self, config: AllReduceConfig) -> str:
        return render_template("allreduce/allreduce.cu.j2", family=self.name, config=repr(config),
                               name=config.kernel_name, algo=config.algo, element=config.element,
                               world_size=config.world_size, threads=config.threads,
                               args_bytes=ALLREDUCE_ARGS_BYTES, constants=constant_checks())

    def launcher(self, config: AllReduceConfig, device_index: int) -> "AllReduceLauncher":
        return AllReduceLauncher(config, get_module(self.build_spec(config), device_index))


class AllReduceLauncher:
    """One loaded all-reduce kernel. Callers keep their own argument blocks (:meth:`block`: the
    peers' addresses are filled once per group), fill the per-call fields and :meth:`launch`
    while holding ``fn.lock``."""

    def __init__(self, config: AllReduceConfig, module):
        self.config = config
        self.fn = module.function(config.kernel_name, AllReduceArgs, config.threads)

    def block(self) -> Tuple[AllReduceArgs, int]:
        return self.fn.block()

    def launch(self, argv: int, stream: int) -> None:
        # Every launch runs MAX_BLOCKS blocks: each counts the call (templates/allreduce/allreduce.cuh).
        self.fn.launch((MAX_BLOCKS, 1, 1), stream, argv)


FAMILY = AllReduceFamily()

__all__ = ["ALGOS", "DATA_OFFSET", "ELEMENTS", "FAMILY", "FUSED", "GEMM_FUSED_MAX_M", "MAX_BLOCKS", "MAX_RANKS",
           "MODES", "NCCL", "ONE_SHOT_MAX_BYTES", "THREADS", "TORCH_DTYPES", "VECTOR_BYTES", "AllReduceArgs",
           "AllReduceConfig", "AllReduceFamily", "AllReduceLauncher", "AllReduceProblem", "buffer_bytes", "check_mode",
           "choose", "choose_gemm_fused"]
