"""The ``sm90s`` family: our own register-A wgmma mainloop for the serving regime (16..256 tokens
per step) on Hopper (templates/sm90s/, design in docs/notes/serving-mainloop.md). The weight is
wgmma's register operand A (64 rows per warpgroup instruction), converted with lop3 from a
TMA-fed shared-memory ring by two consumer warpgroups; the tokens are wgmma N, so at M <= 256 one
token tile covers the batch and each weight element is converted once. It reads the ``sm90a``
weight layout (the H100's one copy; it sets none), compiled for ``sm_90a`` only (wgmma,
setmaxnreg). Each kernel is a shared library with a C ABI (:mod:`.abi`), launched by :mod:`.launch`.
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import OK, Family, Problem, Verdict
from ..common import DTYPES, constant_checks
from ..sm90a import layout
from .abi import ABI_VERSION
from .candidates import candidate_schedules
from .catalog import BITS, catalog_kernels, default_catalog
from .config import TILE_M, Sm90sConfig, double_buffered
from .heuristics import SWITCH_ENV, heuristic_config
from .launch import Sm90sLauncher
from .refit import refit_config


class Sm90sFamily(Family):
    name = "sm90s"
    config_class = Sm90sConfig
    layout = layout.NAME
    sets_layout = False  # it reads the copy prepack makes for the sm90a family on the H100
    arch_flags = ("-gencode=arch=compute_90a,code=sm_90a",)
    output = "shared"  # TMA descriptors are encoded by the kernel library's host code
    min_capability = (9, 0)
    max_capability = (9, 0)  # sm_90a SASS runs on 9.0 only, and there is no PTX to JIT elsewhere

    def can_implement(self, config: Sm90sConfig, problem: Problem) -> Verdict:
        ok, why = super().can_implement(config, problem)
        if not ok:
            return ok, why
        tk = config.tile[2]
        g, k = problem.group_size, problem.k
        if g != k and g % tk and (tk % g or g % 32):
            return False, (f"group size {g} neither divides nor is a multiple of the tile's K={tk} (nor "
                           "per-channel): a k-tile loads whole scale rows, at most TK/32 of them")
        if k % 8:
            return False, f"K={k} is not a multiple of 8: x rows are loaded by TMA in 16-byte units"
        return OK

    def catalog(self) -> List[Sm90sConfig]:
        return default_catalog()

    def refit(self, config: Sm90sConfig, problem: Problem, sms: int, measured: Problem) -> Sm90sConfig:
        """A smaller kernel where a borrowed entry's tiles would not fill this shape, and stream-K or
        a 1xS cluster only in the wave regime they won in (:mod:`.refit`)."""
        return refit_config(config, problem, measured, catalog_kernels(), sms)

    def _reads(self, problem: Problem) -> bool:
        return problem.bits in BITS and self.layout in problem.layout.split("+")

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        return candidate_schedules(problem.m, problem.n, problem.k, sms, problem.bits) if self._reads(problem) else []

    def heuristic(self, problem: Problem, sms: int):
        return heuristic_config(problem, sms) if self._reads(problem) else None

    def packaged(self, capability) -> List[Sm90sConfig]:
        """The whole catalog on the GPUs it runs on: its heuristic is off by default (see
        :mod:`.heuristics`), and a package must serve the switch and profiles that name it. Half
        issue and in-flight kernels (``_hi``, ``_ov``: profile candidates) only come in through a
        profile naming them."""
        return ([c for c in self.catalog() if not (c.half_issue or c.in_flight)] if self.runs_on(capability)[0]
                else [])

    def render(self, config: Sm90sConfig) -> str:
        kernel = config.kernel
        tm, tn, tk = kernel.tile
        return render_template(
            "sm90s/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name,
            element=DTYPES[kernel.dtype][0], bits=kernel.bits, tm=tm, tn=tn, tk=tk,
            stages=kernel.pipeline_stages, ctas_per_sm=kernel.ctas_per_sm, cluster_m=kernel.cluster[0],
            cluster_k=kernel.cluster[1],
            phased="true" if kernel.phased else "false", half_issue="true" if kernel.half_issue else "false",
            in_flight="true" if kernel.in_flight else "false",
            double_buffer="true" if double_buffered(kernel.tile, kernel.ctas_per_sm) else "false",
            smem_bytes=kernel.smem_bytes,
            threads=kernel.threads, abi_version=ABI_VERSION, constants=constant_checks(),
        )

    def launcher(self, config: Sm90sConfig, device_index: int) -> Sm90sLauncher:
        return Sm90sLauncher(config, self.build_spec(config), device_index)


FAMILY = Sm90sFamily()

__all__ = ["FAMILY", "SWITCH_ENV", "TILE_M", "Sm90sConfig", "Sm90sFamily"]
