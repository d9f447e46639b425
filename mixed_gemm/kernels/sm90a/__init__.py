"""The ``sm90a`` family: CUTLASS 3.x warp-specialized wgmma mixed-input GEMM for Hopper
(templates/sm90a/), compiled for ``sm_90a`` only (wgmma and setmaxnreg exist only in the
arch-specific target, so these binaries run on compute capability 9.0 and nowhere else). It reads
the ``sm90a`` weight layout (:mod:`.layout`), which ``prepack`` adds beside the ``sm80`` one on
such GPUs. Each kernel is a shared library with a C ABI (:mod:`.abi`), launched by :mod:`.launch`.
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import OK, Family, Problem, Verdict
from ..common import DTYPES, constant_checks, split_for_waves
from . import layout
from .abi import ABI_VERSION
from .candidates import candidate_schedules
from .catalog import default_catalog
from .config import MAX_SPLITS, Sm90aConfig
from .heuristics import heuristic_config
from .launch import Sm90aLauncher

_QUANT_TYPES = {4: "cutlass::int4b_t", 8: "int8_t"}


class Sm90aFamily(Family):
    name = "sm90a"
    config_class = Sm90aConfig
    layout = layout.NAME
    arch_flags = ("-gencode=arch=compute_90a,code=sm_90a",)
    output = "shared"  # CUTLASS 3.x parameters (TMA descriptors) are built by the kernel's host code
    min_capability = (9, 0)
    max_capability = (9, 0)  # sm_90a SASS runs on 9.0 only, and there is no PTX to JIT elsewhere

    def can_implement(self, config: Sm90aConfig, problem: Problem) -> Verdict:
        ok, why = super().can_implement(config, problem)
        if not ok:
            return ok, why
        tk = config.tile[2]
        g, k, n = problem.group_size, problem.k, problem.n
        if g != k and g % tk:
            # One scale column per k-tile (the collective reloads scales every group / TK tiles).
            return False, (f"group size {g} is not a multiple of the tile's K={tk} (and not per-channel); "
                           f"the collective loads one scale column per k-tile")
        if n % 8:
            return False, f"N={n} is not a multiple of 8: y rows are stored by TMA in 16-byte units"
        if k % 8:
            return False, f"K={k} is not a multiple of 8: x rows are loaded by TMA in 16-byte units"
        return OK

    def refit(self, config: Sm90aConfig, problem: Problem, sms: int, measured: Problem) -> Sm90aConfig:
        """A borrowed split-K factor re-chosen for this shape's waves (every sm90a tile fills an SM
        alone; the transposed problem tiles weight rows by TM and tokens by TN)."""
        if config.decomposition != "split":
            return config
        tm, tn, tk = config.tile
        tiles = -(-problem.n // tm) * -(-problem.m // tn)
        best = min(split_for_waves(config.splits, tiles, -(-problem.k // tk), sms), MAX_SPLITS)
        return config if best == config.splits else config.replace(splits=best)

    def catalog(self) -> List[Sm90aConfig]:
        return default_catalog()

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        return candidate_schedules(problem.m, problem.n, problem.k, problem.group_size, sms, problem.bits)

    def heuristic(self, problem: Problem, sms: int):
        return heuristic_config(problem, sms)

    def render(self, config: Sm90aConfig) -> str:
        kernel = config.kernel
        tm, tn, tk = kernel.tile
        return render_template(
            "sm90a/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name,
            element=DTYPES[kernel.dtype][0], quant=_QUANT_TYPES[kernel.bits], bits=kernel.bits,
            tm=tm, tn=tn, tk=tk, cm=kernel.cluster[0], cn=kernel.cluster[1],
            pingpong="true" if kernel.kind == "pp" else "false", streamk="true" if kernel.streamk else "false",
            stages=kernel.stages, threads=kernel.threads, abi_version=ABI_VERSION, constants=constant_checks(),
        )

    def launcher(self, config: Sm90aConfig, device_index: int) -> Sm90aLauncher:
        return Sm90aLauncher(config, self.build_spec(config), device_index)


FAMILY = Sm90aFamily()

__all__ = ["FAMILY", "Sm90aConfig", "Sm90aFamily", "layout"]
