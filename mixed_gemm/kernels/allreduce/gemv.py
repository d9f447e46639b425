"""The row-parallel decode GEMM fused with its all-reduce: a gemv kernel whose epilogue pushes this
rank's rounded partial tile into every rank's buffer and whose last grid row sums the ranks'
tiles once they arrived (templates/allreduce/gemv_allreduce.cuh). Like the all-reduce kernels it
is outside the GEMM registry: :mod:`mixed_gemm.ops.gemm_allreduce` owns the choice and the calls.

``GemvAllReduceConfig`` (a gemv config and the group's size) is the single source of truth of one
compiled kernel: ``mg_gemvar<W>_<the gemv kernel's name without mg_gemv_>``.
"""
from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Optional

from ...codegen import render_template
from ...runtime import get_module, semaphores, workspace
from ..base import OK, Family, Problem, Verdict, sm_count
from ..common import raise_on
from ..gemv import FAMILY as GEMV, render_params
from ..gemv.abi import GemvArgs
from ..gemv.config import MAX_RING_SMEM, MAX_STATIC_SMEM, GemvConfig
from ..gemv.heuristics import ROWS, heuristic_config, splits_for
from ..gemv.launch import fill_weight
from .config import CHUNK, MAX_CHUNKS, MAX_RANKS, VECTOR_BYTES, constant_checks

_p = ctypes.c_void_p

# Shared memory the fused epilogue adds to the gemv kernel's (static): the staged tile and a few
# flags' call numbers. A config whose total would pass the limits is replaced (gemv_config_for).
_EXTRA_SMEM = 1024
# The sm80-layout decode kernel (Ampere/Ada; 16 tokens) where the weight holds only that copy.
SM80_SCHEDULE = "m16_s1_w4x2_u4_xs_sm80"


class GemvAllReduceArgs(ctypes.Structure):
    """Mirror of ``mixed_gemm::GemvAllReduceArgs``; rendered sources static_assert its size."""

    _fields_ = [("gemv", GemvArgs), ("peers", _p * MAX_RANKS), ("slot_bytes", ctypes.c_longlong),
                ("rank", ctypes.c_int), ("reducers", ctypes.c_int), ("timeout_ns", ctypes.c_ulonglong)]


GEMV_AR_ARGS_BYTES = ctypes.sizeof(GemvAllReduceArgs)


@dataclass(frozen=True)
class GemvAllReduceConfig:
    """The gemv kernel ``gemv`` fused with the all-reduce over ``world_size`` ranks."""

    gemv: GemvConfig
    world_size: int = 2

    family = "gemv_allreduce"

    def __post_init__(self) -> None:
        raise_on([(isinstance(self.gemv, GemvConfig), "gemv must be a GemvConfig"),
                  (isinstance(self.world_size, int) and 2 <= self.world_size <= MAX_RANKS,
                   f"world_size must be an int in [2, {MAX_RANKS}]"),
                  (not isinstance(self.gemv, GemvConfig) or self.fits(self.gemv),
                   "the gemv kernel's shared memory and the staged tile pass the per-CTA limit")],
                 "GemvAllReduceConfig")

    @staticmethod
    def tile_bytes(gemv: GemvConfig) -> int:
        """The epilogue's staged tile: tokens x rows outputs of 2 bytes."""
        return gemv.tokens * gemv.rows * 2

    @classmethod
    def fits(cls, gemv: GemvConfig) -> bool:
        extra = cls.tile_bytes(gemv) + _EXTRA_SMEM
        if gemv.dynamic_smem:
            return gemv.smem_bytes + extra <= MAX_RING_SMEM
        return gemv.smem_bytes + extra <= MAX_STATIC_SMEM

    @property
    def kernel(self) -> "GemvAllReduceConfig":
        return self if self.gemv.kernel == self.gemv else dataclasses.replace(self, gemv=self.gemv.kernel)

    @property
    def kernel_name(self) -> str:
        return f"mg_gemvar{self.world_size}_" + self.gemv.kernel_name[len("mg_gemv_"):]

    @property
    def name(self) -> str:
        return f"mg_gemvar{self.world_size}_" + self.gemv.name[len("mg_gemv_"):]

    @property
    def schedule(self) -> str:
        return self.gemv.schedule

    @property
    def dtype(self) -> str:
        return self.gemv.dtype

    @property
    def bits(self) -> int:
        return self.gemv.bits

    @property
    def zero_mode(self) -> str:
        return self.gemv.zero_mode


class GemvAllReduceFamily(Family):
    name = "gemv_allreduce"
    config_class = GemvAllReduceConfig
    sets_layout = False
    arch_flags = GEMV.arch_flags
    min_capability = GEMV.min_capability

    def layout_of(self, config: GemvAllReduceConfig) -> str:
        return config.gemv.layout

    def can_implement(self, config: GemvAllReduceConfig, problem: Problem) -> Verdict:
        ok, why = GEMV.can_implement(config.gemv, problem)
        if not ok:
            return ok, why
        vec = VECTOR_BYTES // 2
        if problem.n % vec or problem.n > MAX_CHUNKS * CHUNK:
            return False, (f"the fused all-reduce moves rows of 16-byte vectors and has {MAX_CHUNKS} chunks of {CHUNK} "
                           f"outputs: N must be a multiple of {vec} and at most {MAX_CHUNKS * CHUNK}, got {problem.n}")
        return OK

    def render(self, config: GemvAllReduceConfig) -> str:
        kernel = config.kernel
        params = render_params(kernel.gemv)
        params.update(family=self.name, config=repr(kernel), name=kernel.kernel_name, world_size=kernel.world_size,
                      tokens=kernel.gemv.tokens, ar_args_bytes=GEMV_AR_ARGS_BYTES, ar_constants=constant_checks())
        return render_template("gemv/kernel.cu.j2", **params)

    def launcher(self, config: GemvAllReduceConfig, device_index: int) -> "GemvAllReduceLauncher":
        return GemvAllReduceLauncher(config, self.build_spec(config), device_index)


def reducers_for(row_tiles: int, sms: int, ranks_per_gpu: int = 1) -> int:
    """CTAs of the reducing grid row: at most one per two SMs, so the waiting reducers never take
    every CTA slot from the producers they wait for (each reducer loops over its chunks); where
    ``ranks_per_gpu`` ranks share one GPU (emulated ranks), that share of it, so all of their
    waiting reducers together still leave half the SMs to every rank's producers."""
    return max(1, min(row_tiles, sms // (2 * ranks_per_gpu)))


class GemvAllReduceLauncher:
    """``launch(x, w, bias, y, m, stream, residual, comm)``: ``y`` = the sum over the group of
    ``comm`` (an :class:`mixed_gemm.ops.allreduce.Communicator`) of every rank's ``x @ W.T (+ bias)
    (+ residual)``, each rank's partial rounded as the gemv rounds it."""

    def __init__(self, config: GemvAllReduceConfig, spec, device_index: int):
        module = get_module(spec, device_index)
        g = config.gemv
        self.config, self.device_index = config, device_index
        self.fn = module.function(config.kernel_name, GemvAllReduceArgs, g.threads,
                                  g.smem_bytes if g.dynamic_smem else 0)
        self._blocks = {}  # (the weight's view key, this rank's buffer) -> (args, argv, grid, splits, smem)

    def _block(self, w, comm):
        args, argv = self.fn.block()
        row_tiles, splits, smem = fill_weight(args.gemv, self.config.gemv, w)
        for i, p in enumerate(comm.peers):
            args.peers[i] = p
        args.rank, args.slot_bytes, args.timeout_ns = comm.rank, comm.slot_bytes, comm.timeout_ns
        args.reducers = reducers_for(row_tiles, sm_count(self.device_index))
        blk = (args, argv, (row_tiles, splits + 1, 1), splits, smem)  # the last grid row reduces
        self._blocks[(w.parts[self.config.gemv.layout].key, comm.peers[comm.rank])] = blk
        return blk

    def _resources(self, w, m: int, stream: int, comm):
        blk = self._blocks.get((w.parts[self.config.gemv.layout].key, comm.peers[comm.rank]))
        if blk is None:
            blk = self._block(w, comm)
        ws = cnt = 0
        if blk[3] > 1:  # split K
            ws = workspace(self.device_index, stream, blk[3] * m * w.n)
            cnt = semaphores(self.device_index, stream, blk[2][0])
        return blk, ws, cnt

    def prepare(self, w, m: int, stream: int, comm, ranks_per_gpu: int = 1) -> None:
        """Make what a call of ``w`` at ``m`` rows on ``stream`` over ``comm`` needs (the argument
        block, split-K workspace and semaphores), launching nothing. The runtime does this without
        a device synchronization, but the driver may still serialize the GPU's streams for a
        ``cuMemAlloc`` or a module load (the launcher's module is loaded when it is made). Ranks
        that share one GPU (emulated ranks) therefore make every rank's launcher and prepare
        every rank before launching any: a synchronization after one rank's launch waits for its
        reducers, which wait for the ranks not launched yet, until the timeout traps.
        ``ranks_per_gpu``: how many ranks share the GPU (:func:`reducers_for`)."""
        (args, _, grid, _, _), _, _ = self._resources(w, m, stream, comm)
        args.reducers = reducers_for(grid[0], sm_count(self.device_index), ranks_per_gpu)

    def __call__(self, x, w, bias, y, m: int, stream: int, residual, comm) -> None:
        (a, argv, grid, splits, smem), ws, cnt = self._resources(w, m, stream, comm)
        fn = self.fn
        with fn.lock:
            g = a.gemv
            g.x, g.y = x.data_ptr(), y.data_ptr()
            g.bias = 0 if bias is None else bias.data_ptr()
            g.residual = 0 if residual is None else residual.data_ptr()
            g.workspace, g.counters, g.m = ws, cnt, m
            fn.launch(grid, stream, argv, smem[m] if smem else None)


def gemv_config_for(problem: Problem, sms: int, chosen: Optional[GemvConfig] = None) -> Optional[GemvConfig]:
    """The gemv configuration the fused kernel runs for ``problem`` (M: the bucket): ``chosen``
    (what selection picked for the unfused GEMM, when it is a gemv config that fits), so the
    partial sums and the result are the unfused path's bit for bit; else the gemv heuristic's;
    else the layout's decode row (the sm90a table, the sm80-layout kernel). None where no gemv
    kernel reads the weight at this M. A per-rank choice: the protocol pairs ranks by chunks of
    outputs, never by CTA tiles, so ranks may run different configurations."""
    candidates = [chosen, heuristic_config(problem, sms)]
    layouts = problem.layout.split("+")
    rows = [s for max_m, s in ROWS if problem.m <= max_m]
    if "sm90a" in layouts and rows:
        base = GemvConfig.from_schedule(rows[0], **problem.kind)
        if problem.bits == 8:
            base = base.replace(unroll=max(1, base.unroll // 2))
        candidates.append(base.replace(splits=splits_for(base, problem.n, problem.k, sms)))
    if "sm80" in layouts and problem.m <= 16:
        base = GemvConfig.from_schedule(SM80_SCHEDULE, **problem.kind)
        candidates.append(base.replace(splits=splits_for(base, problem.n, problem.k, sms)))
    for config in candidates:
        if (isinstance(config, GemvConfig) and GemvAllReduceConfig.fits(config)
                and GEMV.can_implement(config, problem)[0]):
            return config
    return None


FAMILY = GemvAllReduceFamily()

__all__ = ["FAMILY", "GEMV_AR_ARGS_BYTES", "GemvAllReduceArgs", "GemvAllReduceConfig", "GemvAllReduceFamily",
           "GemvAllReduceLauncher", "gemv_config_for", "reducers_for"]
