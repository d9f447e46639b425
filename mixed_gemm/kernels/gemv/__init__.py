"""The ``gemv`` (decode) family: M <= 32 tokens at the HBM limit (templates/gemv/). The weight
streams from global memory straight into mma.sync fragments, in the layout the large-M family of
the GPU reads: the ``sm90a`` layout (the weight is the A operand: gemv.cuh) on Hopper, the ``sm80``
layout (the weight is the B operand: gemv_sm80.cuh) on Ampere/Ada, so one copy serves every M.
mma.sync runs on sm_80 and later; each config reads one layout (``GemvConfig.layout``).
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import OK, SM80_UP_FLAGS, Family, Problem, Verdict
from ..common import DTYPES, ZERO_MODES, constant_checks, split_for_fill
from ..sm90a import layout
from . import lowbit_layout
from .abi import GEMV_ARGS_BYTES
from .candidates import candidate_schedules
from .catalog import default_catalog
from .config import MAX_SPLITS, GemvConfig
from .heuristics import MAX_M, heuristic_config
from .launch import GemvLauncher


class GemvFamily(Family):
    name = "gemv"
    config_class = GemvConfig
    layout = layout.NAME
    sets_layout = False  # it reads the layout the large-M family of the device chose
    arch_flags = SM80_UP_FLAGS
    min_capability = (8, 0)

    def can_implement(self, config: GemvConfig, problem: Problem) -> Verdict:
        ok, why = super().can_implement(config, problem)
        if not ok:
            return ok, why
        if problem.m > config.tokens:
            return False, f"{config.schedule} serves at most {config.tokens} rows of x, M={problem.m}"
        return OK

    def layout_of(self, config: GemvConfig) -> str:
        return config.layout

    def catalog(self) -> List[GemvConfig]:
        return default_catalog()

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        return candidate_schedules(problem.m, problem.n, problem.k, sms, problem.bits, problem.layout.split("+"))

    def heuristic(self, problem: Problem, sms: int):
        return heuristic_config(problem, sms)

    def refit(self, config: GemvConfig, problem: Problem, sms: int, measured: Problem) -> GemvConfig:
        """Splits for this shape's row tiles: it keeps the measured CTA count where the measured
        factor would under-fill the GPU (fewer tiles) or add CTAs (more; :func:`split_for_fill`)."""
        columns = config.launch_geometry(problem.n, problem.k)[0]
        rows_measured, splits, _, _ = config.launch_geometry(measured.n, measured.k)
        best = split_for_fill(splits, rows_measured, columns, min(MAX_SPLITS, config.steps(problem.k)), sms,
                              keep_count_on_more=True)
        return config if best == splits else config.replace(splits=best)

    def render(self, config: GemvConfig) -> str:
        return render_template("gemv/kernel.cu.j2", **render_params(config.kernel))

    def launcher(self, config: GemvConfig, device_index: int) -> GemvLauncher:
        return GemvLauncher(config, self.build_spec(config), device_index)


def render_params(kernel: GemvConfig) -> dict:
    """What templates/gemv/kernel.cu.j2 renders ``kernel`` (a compiled identity) from; the GEMM-fused
    all-reduce (mixed_gemm.kernels.allreduce.gemv) renders the same kernel with a few more."""
    return dict(
        family="gemv", config=repr(kernel), name=kernel.kernel_name,
        element=DTYPES[kernel.dtype][0], bits=kernel.bits, tiles=max(1, kernel.tokens // 8), strips=kernel.strips,
        fma_tokens=kernel.tokens if kernel.fma else 0,
        layout=kernel.layout, zero_mode_id=ZERO_MODES[kernel.zero_mode],
        warps_n=kernel.warps[0], warps_k=kernel.warps[1], unroll=kernel.unroll,
        stage_x="true" if kernel.stage_x else "false", stages=kernel.stages, dynamic_smem=kernel.dynamic_smem, deferred=kernel.deferred, threads=kernel.threads,
        occupancy=kernel.occupancy,
        rows=kernel.rows, smem_bytes=kernel.smem_bytes, args_bytes=GEMV_ARGS_BYTES, constants=constant_checks(),
        lowbit_constants=lowbit_layout.constant_checks(kernel.bits),
        world_size=0,  # the plain gemv; the fused all-reduce's ranks otherwise
    )


FAMILY = GemvFamily()

__all__ = ["FAMILY", "MAX_M", "GemvConfig", "GemvFamily", "render_params"]
