"""The ``sm80`` family: a CUTLASS 2.x-style multistage mma.sync mixed-input GEMM
(templates/sm80/gemm_sm80.cuh). One fatbin runs on sm_80 and sm_90 (plus compute_90 PTX for newer
GPUs); it reads the ``sm80`` weight layout (:mod:`.layout`), its ``_sm90a`` schedules the Hopper one
copy (the ``sm90a`` layout: decode batches there get this pipeline without a second copy), and its
``_lowbit`` schedules the 1-3-bit and 1:2-sparse weights (the ``lowbit`` layout), for the same batches."""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import OK, SM80_UP_FLAGS, Family, Problem, Verdict
from ..common import DTYPES, ZERO_MODES, constant_checks
from . import layout
from .abi import GEMM_ARGS_BYTES, REDUCE_ARGS_BYTES
from .candidates import candidate_schedules
from .catalog import default_catalog
from .config import LAYOUT_BITS, LAYOUTS, Sm80Config
from .heuristics import heuristic_config, refit_split_k
from .launch import Sm80Launcher

MAX_GRID_Y = 65535  # gridDim.y limit: column-tile groups of one launch


class Sm80Family(Family):
    name = "sm80"
    config_class = Sm80Config
    layout = layout.NAME
    # SASS for A100-class (sm_80) and H100-class (sm_90), compute_90 PTX for newer GPUs to JIT.
    # Plain sm_90 has no wgmma/setmaxnreg (those need sm_90a); mma.sync needs none of them.
    arch_flags = SM80_UP_FLAGS
    min_capability = (8, 0)

    def can_implement(self, config: Sm80Config, problem: Problem) -> Verdict:
        ok, why = super().can_implement(config, problem)
        if not ok:
            return ok, why
        groups_y = config.grid(max(problem.m, 1), -(-problem.n // 64) * 64)[1]
        if groups_y > MAX_GRID_Y:
            return False, (f"N={problem.n} needs {groups_y} column-tile groups with {config.schedule}, "
                           f"above the grid limit {MAX_GRID_Y}")
        return OK

    @staticmethod
    def _layouts(problem: Problem) -> List[str]:
        """The layouts of ``problem``'s weight this family reads at its width."""
        held = problem.layout.split("+")
        return [name for name in LAYOUTS if name in held and problem.bits in LAYOUT_BITS[name]]

    def reads_weight(self, problem: Problem) -> Verdict:
        if not self._layouts(problem):
            read = " or ".join(f"{name!r} ({'/'.join(map(str, LAYOUT_BITS[name]))} bits)" for name in LAYOUTS)
            return False, f"reads the {read} weight layout, the weight holds {problem.layout!r} at {problem.bits} bits"
        return OK

    def layout_of(self, config: Sm80Config) -> str:
        return config.layout

    def catalog(self) -> List[Sm80Config]:
        return default_catalog()

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        return [s for layout in self._layouts(problem)
                for s in candidate_schedules(problem.m, problem.n, problem.k, sms, layout=layout)]

    def heuristic(self, problem: Problem, sms: int):
        layout = next(iter(self._layouts(problem)), LAYOUTS[0])
        return heuristic_config(problem.m, n=problem.n, k=problem.k, sms=sms, layout=layout, **problem.kind)

    def refit(self, config: Sm80Config, problem: Problem, sms: int, measured: Problem) -> Sm80Config:
        return refit_split_k(config, problem, sms, measured)

    def render(self, config: Sm80Config) -> str:
        kernel = config.kernel
        bm, bn, bk = kernel.tile
        wm, wn, wk = kernel.warps
        return render_template(
            "sm80/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name,
            element=DTYPES[kernel.dtype][0], bits=kernel.bits, zero_mode_id=ZERO_MODES[kernel.zero_mode],
            threads=kernel.threads, smem_bytes=kernel.smem_bytes,
            bm=bm, bn=bn, bk=bk, warps_m=wm, warps_n=wn, warps_k=wk, stages=kernel.stages,
            inst_m=kernel.instruction[0], inst_n=kernel.instruction[1], inst_k=kernel.instruction[2],
            atom_layout="false" if kernel.layout == "sm80" else "true",
            args_bytes=GEMM_ARGS_BYTES, reduce_args_bytes=REDUCE_ARGS_BYTES, constants=constant_checks(),
        )

    def launcher(self, config: Sm80Config, device_index: int) -> Sm80Launcher:
        return Sm80Launcher(config, self.build_spec(config), device_index)


FAMILY = Sm80Family()

__all__ = ["FAMILY", "Sm80Config", "Sm80Family", "layout"]
