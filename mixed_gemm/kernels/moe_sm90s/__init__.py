"""The ``moe_sm90s`` family: the dense sm90s mainloop (templates/sm90s/: the weight as wgmma's
register operand A, converted with lop3 from a TMA-fed ring, the tokens as wgmma N) over every
expert's block of routed rows, for decode batches (2..256 tokens) where the experts get a few rows
each: each touched expert's weight tile is streamed once per 16-64 of its rows, by as many CTAs as
its rows x weight-row tiles (one launch, a grid sized from the shapes alone).

It reads the stacked sm90a-layout experts ``prepack_experts`` makes on the H100 (each expert the
dense sm90a family's weight; gate|up interleaved in blocks of 8, so one thread holds a gate row and
its up row and the gate|up stage stores SiLU(gate) * up). Around it: the library's routing sort,
row gather and top-k sum (templates/common/moe_sort.cuh, moe_route.cuh). Compiled for ``sm_90a``
only. A grouped family (``kernels.GROUPED_FAMILIES``); no heuristic: profiles name it where it won.
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import GroupedFamily, MoeProblem, Verdict
from ..common import DTYPES, grouped_constant_checks
from ..moe_route import SORT_ARGS_BYTES, SORT_MAX_EXPERTS, SORT_THREADS, sort_limits
from ..sm90a import layout
from ..sm90s.config import double_buffered
from .abi import ABI_VERSION
from .candidates import candidate_schedules
from .catalog import BITS, default_catalog
from .config import STAGED_PAD, MoeSm90sConfig
from .launch import MoeSm90sLauncher


class MoeSm90sFamily(GroupedFamily):
    name = "moe_sm90s"
    config_class = MoeSm90sConfig
    layout = layout.NAME
    sets_layout = False  # it reads the sm90a copy prepack_experts made on the H100
    arch_flags = ("-gencode=arch=compute_90a,code=sm_90a",)
    output = "shared"  # TMA descriptors are encoded by the kernel library's host code
    min_capability = (9, 0)
    max_capability = (9, 0)

    def grouped_rules(self, config: MoeSm90sConfig, problem: MoeProblem) -> Verdict:
        tk = config.tile[2]
        g, k, n = problem.group_size, problem.k, problem.n
        if problem.bits not in BITS:
            return False, f"{problem.bits}-bit weights: the moe_sm90s catalog holds {BITS}-bit kernels"
        if g not in (-1, k) and g % tk and (tk % g or g % 32):
            return False, (f"group size {g} neither divides nor is a multiple of the tile's K={tk} (nor "
                           "per-channel): a k-tile loads whole scale rows, at most TK/32 of them")
        if k % 8:
            return False, f"K={k} is not a multiple of 8: the sorted rows are loaded by TMA in 16-byte units"
        if problem.stage == "w13" and n % 16:
            return False, f"gate|up: N = 2I must be a multiple of 16 (gate and up rows in blocks of 8), got N={n}"
        if config.staged and n % 8:
            return False, (f"staged epilogue (_se): N={n} is not a multiple of 8 (each token row is stored by "
                           "whole 16-byte chunks)")
        return sort_limits(problem.pairs, problem.experts)

    def catalog(self) -> List[MoeSm90sConfig]:
        return default_catalog()

    def packaged(self, capability) -> List[MoeSm90sConfig]:
        """The catalog but the half-issue, gather and staged-epilogue kernels (profile candidates: in a
        package where a profile names them)."""
        return [c for c in super().packaged(capability) if not (c.half_issue or c.gather or c.staged)]

    def candidates(self, problem, sms: int) -> List[str]:
        return candidate_schedules(problem, sms) if isinstance(problem, MoeProblem) else []

    def heuristic(self, problem, sms: int):
        return None  # profile-only until a sweep shows where it wins (docs/notes/moe.md)

    def render(self, config: MoeSm90sConfig) -> str:
        kernel = config.kernel
        tm, tn, tk = kernel.tile
        return render_template(
            "moe_sm90s/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name,
            element=DTYPES[kernel.dtype][0], bits=kernel.bits, tm=tm, tn=tn, tk=tk,
            stages=kernel.pipeline_stages, smem_bytes=kernel.smem_bytes, threads=kernel.threads,
            half_issue="true" if kernel.half_issue else "false", gather="true" if kernel.gather else "false",
            staged="true" if kernel.staged else "false", staged_pad=STAGED_PAD,
            double_buffer="true" if double_buffered(kernel.tile, 1) else "false",
            abi_version=ABI_VERSION, sort_args_bytes=SORT_ARGS_BYTES, sort_threads=SORT_THREADS,
            sort_max_experts=SORT_MAX_EXPERTS, constants=grouped_constant_checks(),
        )

    def launcher(self, config: MoeSm90sConfig, device_index: int) -> MoeSm90sLauncher:
        """One launcher per (config, device), kept (it holds the per-weight descriptors; making one
        loads the module, which a CUDA-graph capture must not see)."""
        key = (config.kernel, config.stage, config.splits, config.persistent, config.combine, device_index)
        return self.kept_launcher(key, lambda: MoeSm90sLauncher(config, self.build_spec(config), device_index))


FAMILY = MoeSm90sFamily()

__all__ = ["FAMILY", "MoeSm90sConfig", "MoeSm90sFamily"]
