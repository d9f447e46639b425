"""What every kernel family provides: the contract the registry, selection and ``matmul`` rely on.

A family is one sub-package of :mod:`mixed_gemm.kernels` holding a :class:`Family` subclass. It
owns its frozen config class (name, schedule string, ``from_schedule``), its catalog, the schedules
the profiler tries, its argument structs and launch plan, its templates (``templates/<family>/``
plus ``templates/common/``), its arch flags, and the weight layout it reads. docs/DESIGN.md has the
checklist for adding one.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..compile import BuildSpec, lookup

Verdict = Tuple[bool, str]  # (ok, reason when not ok)
OK: Verdict = (True, "")


@dataclass(frozen=True)
class Problem:
    """One GEMM as selection sees it: ``y (m, n) = x (m, k) @ W.T`` for a weight of this kind."""

    m: int
    n: int
    k: int
    dtype: str          # "f16" | "bf16" (activations, output, scales)
    bits: int
    zero_mode: str      # "sym" | "int" | "float" | "offset"
    group_size: int     # K for per-channel
    layout: str         # the weight layouts the PackedWeight holds ("sm80", "sm90a" or "sm80+sm90a")

    @property
    def kind(self) -> dict:
        return dict(dtype=self.dtype, bits=self.bits, zero_mode=self.zero_mode)


@dataclass(frozen=True)
class MoeProblem:
    """One projection of a mixture-of-experts layer as a grouped family sees it (``GROUPED_FAMILIES``):
    ``tokens`` x ``top_k`` (token, slot) pairs, each multiplying one row by its expert's ``(n, k)``
    weight, ``experts`` of them stacked (``ops.experts.PackedExperts``). ``stage``: ``"w13"`` (gate|up,
    ``n`` = 2I, ``k`` = H; SiLU(gate) * up follows) or ``"w2"`` (down, ``n`` = H, ``k`` = I; the top-k
    weighted sum follows). ``gate_up``: the w13 weight's rows are interleaved gate|up blocks
    (``ops.experts``: what ``moe`` runs; the tile families' fused SiLU·mul needs it), not gate rows
    then up rows (a dense gate|up weight, ``ops.gated``). Shapes only: nothing here depends on the
    routing's values."""

    tokens: int
    top_k: int
    experts: int
    n: int
    k: int
    dtype: str
    bits: int
    zero_mode: str
    group_size: int
    layout: str
    stage: str
    gate_up: bool = False

    @property
    def pairs(self) -> int:
        return self.tokens * self.top_k

    @property
    def kind(self) -> dict:
        return dict(dtype=self.dtype, bits=self.bits, zero_mode=self.zero_mode)


@functools.lru_cache(maxsize=None)
def compute_capability(device_index: int) -> Optional[Tuple[int, int]]:
    """``(major, minor)`` of CUDA device ``device_index``, or None without a visible GPU."""
    try:
        import torch

        if torch.cuda.is_available() and device_index < torch.cuda.device_count():
            return torch.cuda.get_device_capability(device_index)
    except Exception:  # noqa: BLE001 - a CPU-only or broken torch means "no GPU" here
        pass
    return None


DEFAULT_SMS = 132  # H100 SXM, when no GPU is visible (tests, explain on a CPU machine)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """Multiprocessors of CUDA device ``device_index`` (``DEFAULT_SMS`` without a visible GPU)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(device_index).multi_processor_count
    except Exception:  # noqa: BLE001 - a CPU-only torch: fall back to the default
        pass
    return DEFAULT_SMS


# The fatbin of a family that runs from Ampere on: sm_80 and sm_90 code, and sm_90 PTX that newer
# GPUs compile at load (plain sm_90: no wgmma/setmaxnreg, which need sm_90a).
SM80_UP_FLAGS: Tuple[str, ...] = (
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
)


class Family:
    """Base class of a kernel family; subclasses set the class attributes and override the hooks."""

    name: str = ""                        # "sm80": kernel names are mg_<name>_..., schedules "<name>:..."
    config_class: type = object           # its frozen config (has dtype, bits, zero_mode, schedule, name)
    layout: str = ""                      # the weight layout it reads (see kernels.LAYOUTS)
    sets_layout: bool = True              # prepack packs for it on GPUs it runs on (see layout_for)
    arch_flags: Tuple[str, ...] = ()      # nvcc -gencode flags of its fatbins
    output: str = "fatbin"                # what nvcc builds: "fatbin" or "shared" (kernel + host code, ctypes)
    min_capability: Tuple[int, int] = (8, 0)
    max_capability: Tuple[int, int] = (99, 9)

    # ---- where it runs ----
    def runs_on(self, capability: Optional[Tuple[int, int]], what: str = "the GPU") -> Verdict:
        """Can this family's binaries run on a GPU of compute ``capability`` (None: no GPU)?"""
        if capability is None:
            return False, "no CUDA GPU visible"
        if not self.min_capability <= capability <= self.max_capability:
            lo, hi = self.min_capability, self.max_capability
            return False, (f"needs compute capability {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}, "
                           f"{what} is {capability[0]}.{capability[1]}")
        return OK

    def supports(self, device_index: int) -> Verdict:
        """Can this family's binaries run on CUDA device ``device_index``?"""
        return self.runs_on(compute_capability(device_index), f"device {device_index}")

    def reads_weight(self, problem: Problem) -> Verdict:
        """Can any config of this family read ``problem``'s weight? A family that sets the layout
        (a tile family) reads only its own; the others read what they find (their configs say)."""
        if self.sets_layout and self.layout not in problem.layout.split("+"):
            return False, f"reads the {self.layout!r} weight layout, the weight holds {problem.layout!r}"
        return OK

    def can_implement(self, config, problem: Problem) -> Verdict:
        """Can ``config`` (one of this family's) compute ``problem``? Layout and weight kind here;
        families add their own rules."""
        if self.layout_of(config) not in problem.layout.split("+"):
            return False, f"reads the {self.layout_of(config)!r} weight layout, the weight holds {problem.layout!r}"
        if (config.dtype, config.bits, config.zero_mode) != (problem.dtype, problem.bits, problem.zero_mode):
            return False, (f"{config.name} is for {config.dtype}/{config.bits}-bit/{config.zero_mode} weights, "
                           f"this weight is {problem.dtype}/{problem.bits}-bit/{problem.zero_mode}")
        return OK

    def layout_of(self, config) -> str:
        """The weight layout ``config`` reads (the family's, unless it reads several)."""
        return self.layout

    # ---- configs ----
    def from_schedule(self, schedule: str, *, dtype: str, bits: int, zero_mode: str):
        return self.config_class.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=zero_mode)

    def catalog(self) -> List:
        """The compiled configs ``mixed-gemm build --all`` precompiles and ``generated/`` shows."""
        return []

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        """Schedules (without the family prefix) the profiler times for ``problem``."""
        return []

    def heuristic(self, problem: Problem, sms: int):
        """This family's config for ``problem`` when no profile covers it, or None to pass."""
        return None

    def packaged(self, capability: Tuple[int, int]) -> List:
        """Compiled configs a kernel package for GPUs of ``capability`` holds besides what selection
        picks there without a user profile: a family whose heuristic is off by default ships its
        catalog, so that switching it on, or a user profile naming it, finds its kernels without
        nvcc. Default: none."""
        return []

    def pays(self, tokens: int, top_k: int, experts: int) -> bool:
        """Grouped families (``GROUPED_FAMILIES``): worth running for ``tokens`` x ``top_k`` pairs over
        ``experts`` outside CUDA-graph capture, where ``moe`` has its per-expert path to fall back on?"""
        return True

    def refit(self, config, problem: Problem, sms: int, measured: Problem):
        """``config`` measured best on ``measured`` (a similar shape at the entry's M bucket),
        adjusted to ``problem``'s (selection calls this when it borrows the nearest profiled shape's
        entry): typically its split factor, for the waves or the fill of ``sms`` SMs. Default:
        unchanged."""
        return config

    def for_layout(self, config, problem: Problem):
        """``config`` made to read a layout ``problem``'s weight holds, for a family that reads
        several with one schedule (a profile entry names what won, not which copy it read).
        Default: unchanged (a tile family reads only its own layout)."""
        return config

    # ---- building and launching ----
    def render(self, config) -> str:
        """The .cu source of ``config``'s compiled identity."""
        raise NotImplementedError

    def build_spec(self, config) -> BuildSpec:
        """What the runtime needs to find, build and load ``config``'s compiled identity."""
        kernel = config.kernel
        return BuildSpec(kernel.kernel_name, lambda: self.render(kernel), self.arch_flags, self.output)

    def ready(self, config) -> bool:
        """Is ``config``'s binary available without compiling (an installed kernel package or the
        kernel cache holds it, verified)?"""
        spec = self.build_spec(config)
        return lookup(spec.name, spec.source(), arch_flags=spec.arch_flags, output=spec.output) is not None

    def launcher(self, config, device_index: int):
        """A callable ``launch(x, w, bias, y, m, stream, residual=None)`` for ``config`` on
        ``device_index``: ``y = x @ W.T (+ bias) (+ residual)``, the residual ``(..., N)`` like ``y``
        and not overlapping it (added in the epilogue by the kernels that read it, else after)
        (loads the module; callers cache it). ``x`` is contiguous and in the weight's K order."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<kernel family {self.name}>"


_KEPT_LOCK = threading.Lock()  # making a kept launcher (rare): one lock for all grouped families


class GroupedFamily(Family):
    """A grouped (mixture-of-experts) family: its configs carry the ``stage`` they run, and its
    problems are :class:`MoeProblem`. :meth:`can_implement` checks what every grouped family needs
    first; subclasses add their own rules in :meth:`grouped_rules`."""

    # Reads a gate|up weight whose rows are gate then up (a dense gate|up weight), besides the
    # interleaved stacks moe runs; the tile families' gated epilogues read only those.
    reads_gate_up_halves = False

    def can_implement(self, config, problem) -> Verdict:
        if not isinstance(problem, MoeProblem):
            return False, (f"{self.name} runs the projections of a mixture-of-experts layer (mixed_gemm.moe, a "
                           "MoeProblem), not a dense matmul")
        ok, why = super().can_implement(config, problem)
        if not ok:
            return ok, why
        if config.stage != problem.stage:
            return False, f"{config.schedule} is the {config.stage} kernel, the problem is the {problem.stage} projection"
        if problem.stage == "w13" and not problem.gate_up and not self.reads_gate_up_halves:
            return False, ("its epilogue forms SiLU(gate) * up from gate|up rows interleaved in blocks of 8 "
                           "(prepack_experts(..., gate_up=True)); this weight holds gate rows, then up rows")
        return self.grouped_rules(config, problem)

    def grouped_rules(self, config, problem: "MoeProblem") -> Verdict:
        """This family's own rules for a problem of the config's stage and weight kind."""
        return OK

    def packaged(self, capability: Tuple[int, int]) -> List:
        """A grouped family's choice depends on the routing and the experts' shapes, which no grid
        enumerates: a package for GPUs it runs on holds its whole catalog (``select.coverage`` adds
        what a shipped profile's grouped entries name)."""
        return self.catalog() if self.runs_on(capability)[0] else []

    def kept_launcher(self, key, make):
        """The launcher kept under ``key`` (``(config, device)`` and what else tells launchers apart),
        made once by ``make()``, thread-safe: for launchers that hold per-weight device state, and
        whose making loads a module (the driver may synchronize the context), which a CUDA-graph
        capture must not see."""
        kept = self.__dict__.setdefault("_kept_launchers", {})
        launcher = kept.get(key)
        if launcher is None:
            with _KEPT_LOCK:
                launcher = kept.get(key)
                if launcher is None:
                    launcher = kept[key] = make()
        return launcher

    def plan_rules(self, configs) -> Verdict:
        """Can ``configs`` = (gate|up config, down config) run as one plan (each already runs its own
        projection)? For configs that bind the two projections together (moe_gemv's one-launch mode)."""
        return OK

    def layer_candidates(self, problems, sms: int) -> List[Tuple[str, str]]:
        """(gate|up schedule, down schedule) pairs the profiler times as one layer: configs that run
        both projections in one launch (their launcher's ``launch_layer``); ``problems`` = (gate|up
        problem, down problem). Default: none."""
        return []
