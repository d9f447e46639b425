"""The ``moe_sm90a`` family: the many-token side of a mixture-of-experts layer on Hopper:
CUTLASS 3.x's ptr-array (grouped) wgmma mixed-input GEMM, one group per expert, reading the stacked
sm90a-layout experts (``ops.experts.PackedExperts``: each expert exactly the dense sm90a family's
weight) once per tile of the rows routed to it (templates/moe_sm90a/).

A call sorts the (token, slot) pairs by expert on the device (the library's two route kernels, a
counting sort), gathers their rows (TMA reads a contiguous box: no row index), writes the
per-expert problem sizes and pointers into device arrays (one kernel) and launches the grouped
kernel; gate|up is followed by SiLU(gate) * up, down by the top-k weighted sum (launch.py). No host sync: it runs
under CUDA-graph capture. Compiled for ``sm_90a`` only, like the dense sm90a family.

A grouped family (``kernels.GROUPED_FAMILIES``): ``ops.moe_grouped`` asks it first, and its
heuristic passes (None) while the routed experts get few pairs each, leaving those to moe_gemv.
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import GroupedFamily, MoeProblem, Verdict
from ..common import DTYPES, grouped_constant_checks
from ..sm90a import layout
from ..moe_route import SORT_ARGS_BYTES, SORT_MAX_EXPERTS, SORT_THREADS, sort_limits
from .abi import ABI_VERSION
from .candidates import candidate_schedules
from .catalog import default_catalog
from .config import MoeSm90aConfig
from .heuristics import heuristic_config
from .launch import MoeSm90aLauncher

_QUANT_TYPES = {4: "cutlass::int4b_t", 8: "int8_t"}


class MoeSm90aFamily(GroupedFamily):
    name = "moe_sm90a"
    config_class = MoeSm90aConfig
    layout = layout.NAME
    sets_layout = False  # it reads the sm90a copy prepack_experts made on the H100
    arch_flags = ("-gencode=arch=compute_90a,code=sm_90a",)
    output = "shared"  # CUTLASS 3.x parameters are built by the kernel's host code
    min_capability = (9, 0)
    max_capability = (9, 0)  # sm_90a SASS runs on 9.0 only

    def grouped_rules(self, config: MoeSm90aConfig, problem: MoeProblem) -> Verdict:
        tk = config.tile[2]
        g, k, n = problem.group_size, problem.k, problem.n
        if g not in (-1, k) and g % tk:
            return False, (f"group size {g} is not a multiple of the tile's K={tk} (and not per-channel): the "
                           "collective loads one scale column per k-tile")
        if n % 8 or k % 8:
            return False, (f"N and K must be multiples of 8 (rows of x and of the output move by TMA in 16-byte "
                           f"units), got N={n}, K={k}")
        if problem.stage == "w13" and n % 2:
            return False, f"gate|up: N = 2I must be even, got N={n}"
        return sort_limits(problem.pairs, problem.experts, "32-bit problem sizes")

    def catalog(self) -> List[MoeSm90aConfig]:
        return default_catalog()

    def candidates(self, problem, sms: int) -> List[str]:
        return candidate_schedules(problem) if isinstance(problem, MoeProblem) else []

    def heuristic(self, problem, sms: int):
        return heuristic_config(problem) if isinstance(problem, MoeProblem) else None

    def render(self, config: MoeSm90aConfig) -> str:
        kernel = config.kernel
        tm, tn, tk = kernel.tile
        return render_template(
            "moe_sm90a/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name,
            element=DTYPES[kernel.dtype][0], quant=_QUANT_TYPES[kernel.bits], bits=kernel.bits,
            tm=tm, tn=tn, tk=tk, stages=kernel.stages, cluster=kernel.cluster, threads=kernel.threads, abi_version=ABI_VERSION,
            sort_args_bytes=SORT_ARGS_BYTES, sort_threads=SORT_THREADS, sort_max_experts=SORT_MAX_EXPERTS,
            constants=grouped_constant_checks(),
        )

    def launcher(self, config: MoeSm90aConfig, device_index: int) -> MoeSm90aLauncher:
        """One launcher per (config, device), kept: it holds the per-weight device arrays, and making
        one sets the module up (the driver may synchronize the context to load it), which a CUDA-graph
        capture must not see."""
        key = (config, device_index)
        return self.kept_launcher(key, lambda: MoeSm90aLauncher(config, self.build_spec(config), device_index))


FAMILY = MoeSm90aFamily()

__all__ = ["FAMILY", "MoeSm90aConfig", "MoeSm90aFamily"]
