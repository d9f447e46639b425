"""The grouped path of ``moe``: which grouped kernels (``kernels.GROUPED_FAMILIES``) run a pair of
expert stacks, chosen once per ``(w13, w2, top_k, T bucket, device)`` (:func:`grouped_plan`: the
profile's grouped entries measured near this token count, else the first family whose configs, the
profile's nearest or its heuristic's, run both projections), and the two launches
(:func:`run_grouped`). :func:`moe_grouped` forces this path (tests, benchmarks).

Forcing the kernels of every plan (sweeps, A/B timings, debugging): ``$MIXED_GEMM_MOE_SCHEDULE`` =
``"family:gate|up schedule,family:down schedule"`` (``moe_gemv:w13_s1_w4x2_u8_m8_pe_split2,
moe_gemv:w2_s1_w4x2_u8_m16_pe``; the two families may differ), or :func:`forced_schedules` (a context
manager, ahead of the variable). Either is read when a plan is made, never on the hot path: set the
variable before the first ``moe`` call or call :func:`clear_plans` after changing it. A forced plan
runs outside capture at every T (``pays``), and one that cannot run raises ``ValueError`` naming why.
The schedule is taken as written: its ``_split<S>`` (none: one K slice) holds at every T.

Programmatic dependent launch of the down kernel (Hopper's PDL: it starts while gate|up finishes and
waits for h; templates/moe_gemv/moe_pdl.cuh). ``$MIXED_GEMM_MOE_PDL`` (read once, at the first
call): ``0`` or ``off``, never; unset or ``auto``, on for the launchers that name it their default
(``pdl_default``: moe_gemv's pair-mode downs on sm_90+, 0.3-0.7 µs a layer faster at 1-4 tokens on
the H200, docs/notes/moe.md); ``prefetch``, on for every capable launcher with the L2 prefetch of
the down weights before the wait (measured 2-4 µs slower: kept for A/Bs); anything else, on for
every capable launcher (``pdl_capable``: moe_gemv's two-launch downs on sm_90+). :func:`pdl_launches` sets it for a block,
ahead of the variable (A/B timings). docs/notes/moe.md has the measurements. A CUDA graph records
the choice made when it was captured."""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
from typing import Dict, List, Optional, Tuple, Union

import torch

from ..compile import JitDisabledError, background, blocking, jit_mode
from ..kernels import GROUPED_FAMILIES, MoeProblem, family_of, parse_schedule
from ..kernels.base import sm_count
from ..kernels.moe_route import tile_heights
from ..runtime import current_stream
from ..select import device_profile, m_bucket
from .experts import PackedExperts, check_moe_inputs
from .packed import KERNEL_DTYPES

log = logging.getLogger(__name__)


class GroupedPlan:
    """The grouped kernels of one ``(w13, w2, top_k, T bucket, device)``: a config per projection
    (``configs`` = (gate|up, down)), each of a grouped family (``families``; the two may differ: every
    grouped family hands the down projection ``h`` in the same (pair, I) rows), chosen once
    (:func:`grouped_plan`), their launchers loaded on first use. :meth:`pays` says whether to run
    them outside capture. ``source``: where the configs came from (``"override"``, ``"profile"``,
    ``"heuristic"``, ``"profile+heuristic"`` or ``"configs argument"``)."""

    __slots__ = ("families", "configs", "device_index", "source", "_launchers", "_lock")

    def __init__(self, families, configs, device_index: int, source: str = "heuristic"):
        self.families, self.configs, self.device_index = tuple(families), tuple(configs), device_index
        self.source = source
        self._launchers = None
        self._lock = threading.Lock()

    @property
    def family(self):
        """The gate|up projection's family (the down projection's too, unless a profile mixed them)."""
        return self.families[0]

    def pays(self, tokens: int, top_k: int, experts: int) -> bool:
        return self.source == "override" or all(f.pays(tokens, top_k, experts) for f in self.families)

    def launchers(self, capturing: bool = False):
        """``(gate|up launcher, down launcher)``, or None while they are not available: with
        ``MIXED_GEMM_JIT=async`` (outside capture) a kernel neither packaged nor cached compiles in
        the background meanwhile, as matmul's do; with ``off`` a missing kernel never comes."""
        if self._launchers is not None:
            return self._launchers
        with self._lock:
            if self._launchers is not None:
                return self._launchers
            pairs = tuple(zip(self.families, self.configs))
            if jit_mode() == "async" and not capturing and not all(f.ready(c) for f, c in pairs):
                jobs = [background.submit(f.build_spec(c)) for f, c in pairs]
                if not all(j.done() for j in jobs):
                    return None  # the per-expert path runs while they compile
                failed = next((j.exception() for j in jobs if j.exception() is not None), None)
                if failed is not None:
                    log.warning("grouped MoE kernels could not be built (%s); the per-expert path runs", failed)
                    return None
            try:
                self._launchers = tuple(f.launcher(c, self.device_index) for f, c in pairs)
            except JitDisabledError:
                if capturing:
                    raise
                return None
            return self._launchers

    def __repr__(self) -> str:
        return (f"GroupedPlan(schedules={[f'{f.name}:{c.schedule}' for f, c in zip(self.families, self.configs)]!r}, "
                f"source={self.source!r})")


# (w13 signature, w2 signature, top_k, T bucket, device[, forced configs]) -> GroupedPlan, or the
# reason no grouped family runs it
GROUPED: Dict[Tuple, Union[GroupedPlan, str]] = {}
_GROUPED_LOCK = threading.Lock()
SCHEDULE_ENV = "MIXED_GEMM_MOE_SCHEDULE"
_FORCED: List[str] = []  # forced_schedules()' stack of "w13,w2" texts (the innermost last)
PDL_ENV = "MIXED_GEMM_MOE_PDL"
_PDL: List[str] = []  # pdl_launches()' stack of modes (the innermost last)
PDL_MODES = ("auto", "on", "off", "prefetch")


def clear_plans() -> None:
    """Forget every cached plan (after changing ``$MIXED_GEMM_MOE_SCHEDULE`` or a profile)."""
    with _GROUPED_LOCK:
        GROUPED.clear()


@contextlib.contextmanager
def forced_schedules(w13: str, w2: str):
    """Inside the block every grouped plan runs ``w13`` (gate|up) and ``w2`` (down), each a
    ``"family:schedule"`` (module docstring), ahead of ``$MIXED_GEMM_MOE_SCHEDULE``; the cached plans
    are forgotten on entry and on exit. Process-wide (benchmarks, sweeps), not per thread."""
    _FORCED.append(f"{w13},{w2}")
    clear_plans()
    try:
        yield
    finally:
        _FORCED.pop()
        clear_plans()


@functools.lru_cache(maxsize=1)
def _pdl_env() -> str:
    """``$MIXED_GEMM_MOE_PDL`` as one of :data:`PDL_MODES`, read once (module docstring)."""
    text = os.environ.get(PDL_ENV, "").strip().lower()
    if text in ("0", "off", "no", "false"):
        return "off"
    if text in ("", "auto"):
        return "auto"
    return "prefetch" if text == "prefetch" else "on"


def pdl_mode() -> str:
    """How run_grouped launches the down kernel: one of :data:`PDL_MODES` (module docstring)."""
    return _PDL[-1] if _PDL else _pdl_env()


def pdl_enabled() -> bool:
    """Does run_grouped launch every capable down kernel as a programmatic dependent (``on`` or
    ``prefetch``)? In ``auto`` mode only the launchers whose ``pdl_default`` says so."""
    return pdl_mode() in ("on", "prefetch")


@contextlib.contextmanager
def pdl_launches(enabled: bool = True, prefetch: bool = False):
    """Inside the block run_grouped launches every capable down kernel with PDL (``enabled``; with
    ``prefetch``, and the L2 prefetch before its wait) or none, ahead of ``$MIXED_GEMM_MOE_PDL``.
    Process-wide (benchmarks, A/B timings), not per thread; no plan depends on it (the kernels are
    the same), so none is forgotten."""
    _PDL.append(("prefetch" if prefetch else "on") if enabled else "off")
    try:
        yield
    finally:
        _PDL.pop()


_NO_PDL, _WITH_PDL, _WITH_PDL_PREFETCH = {}, {"pdl": True}, {"pdl": True, "pdl_prefetch": True}


def _down_pdl(down) -> dict:
    """run_grouped's PDL arguments for the ``down`` launcher under :func:`pdl_mode` (shared, never
    modified: the hot path builds no dict for them)."""
    if not getattr(down, "pdl_capable", False):
        return _NO_PDL
    mode = pdl_mode()
    if mode == "prefetch":
        return _WITH_PDL_PREFETCH
    if mode == "on" or (mode == "auto" and getattr(down, "pdl_default", False)):
        return _WITH_PDL
    return _NO_PDL


def _forced_text() -> Tuple[Optional[str], str]:
    """The forced ``"w13,w2"`` schedules (or None) and who forced them, for messages."""
    if _FORCED:
        return _FORCED[-1], "forced_schedules"
    return os.environ.get(SCHEDULE_ENV) or None, SCHEDULE_ENV


def _forced_plan(text: str, where: str, problems, stacked: Optional[str], device_index: int) -> GroupedPlan:
    """The plan of the forced schedules, or ``ValueError`` naming ``where`` and why it cannot run."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"{where}: expected 'family:gate|up schedule,family:down schedule' "
                         f"(e.g. moe_gemv:w13_s1_w4x2_u8_m8_pe,moe_gemv:w2_s1_w4x2_u8_m8_pe), got {text!r}")
    configs = []
    for part, problem in zip(parts, problems):
        try:
            config = parse_schedule(part, **problem.kind)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: {part!r}: {exc}") from None
        fam = family_of(config)
        if fam not in GROUPED_FAMILIES:
            raise ValueError(f"{where}: {part!r} is a {fam.name} schedule, not one of a grouped family "
                             f"({', '.join(f.name for f in GROUPED_FAMILIES)})")
        why = _config_reason(config, problem, stacked, device_index)
        if why is not None:
            raise ValueError(f"{where}={text}: {fam.name} cannot run the {problem.stage} projection here: {why}")
        configs.append(config)
    why = _pair_reason(configs)
    if why is not None:
        raise ValueError(f"{where}={text}: {why}")
    return GroupedPlan([family_of(c) for c in configs], configs, device_index, source="override")


def _config_reason(config, problem: MoeProblem, stacked: Optional[str], device_index: int) -> Optional[str]:
    """Why ``config``'s family cannot run ``problem`` here (the device, its ``can_implement``, then the
    experts' tensors), or None."""
    fam = family_of(config)
    ok, why = fam.supports(device_index)
    if ok:
        ok, why = fam.can_implement(config, problem)
    if ok and stacked is not None:
        ok, why = False, stacked
    return None if ok else why


def _pair_reason(configs) -> Optional[str]:
    """Why ``configs`` = (gate|up, down) cannot run as one plan (each family's ``plan_rules``), or None."""
    for fam in {family_of(c) for c in configs}:
        ok, why = fam.plan_rules(tuple(configs))
        if not ok:
            return f"{fam.name}: {why}"
    return None


def _problems(tokens: int, top_k: int, w13: PackedExperts, w2: PackedExperts):
    kind = dict(dtype=KERNEL_DTYPES[w13.dtype], bits=w13.bits, zero_mode=w13.zero_mode)
    return tuple(MoeProblem(tokens=tokens, top_k=top_k, experts=w.num_experts, n=w.n, k=w.k, group_size=w.group_size,
                            layout=w.layout, stage=stage, gate_up=w.gate_up, **kind)
                 for w, stage in ((w13, "w13"), (w2, "w2")))


def _stacked_reason(w13: PackedExperts, w2: PackedExperts) -> Optional[str]:
    for name, w in (("w13", w13), ("w2", w2)):
        if w.zeros is None or not all(t.is_contiguous() for t in (w.b, w.scales, w.zeros)):
            return f"{name}: the grouped kernels read contiguous stacked b, scales and zeros (prepack_experts' tensors)"
    return None


def grouped_plan(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, top_k: int,
                 configs=None) -> Union[GroupedPlan, str]:
    """The :class:`GroupedPlan` for ``moe`` on ``x``'s rows (cached per signatures, ``top_k`` and the
    power-of-two bucket of T), or the reason (a str, one clause per grouped family) none runs it.
    ``configs`` = (gate|up config, down config) forces the kernels (tests, sweeps; cached with them,
    so a forced call loads its launchers once and captures like ``moe``'s); else the forced
    schedules (module docstring), the profile's, the heuristics'."""
    tokens = x.shape[0]
    device_index = x.device.index if x.is_cuda else 0  # (a CPU x: what device 0 would run, for tests)
    key = (w13.signature, w2.signature, top_k, m_bucket(max(1, tokens)), device_index)
    if configs is not None:
        configs = tuple(configs)
        key += (configs,)
    plan = GROUPED.get(key)
    if plan is not None:
        return plan
    problems = _problems(m_bucket(max(1, tokens)), top_k, w13, w2)
    profile = device_profile(device_index) if x.is_cuda and configs is None else None
    stacked = _stacked_reason(w13, w2)
    forced, where = _forced_text() if configs is None else (None, "")
    near = None if configs is not None or stacked is not None or forced else \
        _near_profiled(problems, profile, device_index)
    if configs is not None and len({family_of(c) for c in configs}) > 1:
        plan = _mixed_plan(configs, problems, stacked, device_index)
    elif forced:
        plan = _forced_plan(forced, where, problems, stacked, device_index)
    elif near is not None:  # the profile measured both projections near these tokens: its kernels, whichever families
        plan = GroupedPlan([family_of(c) for c in near], near, device_index, source="profile")
    else:
        plan = _family_plan(GROUPED_FAMILIES if configs is None else (_family_of_configs(configs),), problems,
                            configs, profile, stacked, device_index)
    with _GROUPED_LOCK:
        return GROUPED.setdefault(key, plan)


def _family_plan(families, problems, configs, profile, stacked: Optional[str],
                 device_index: int) -> Union[GroupedPlan, str]:
    """The first of ``families`` whose configs (``configs``, else the profile's nearest of its own or
    its heuristic's) run both projections here, or the reasons none does, one clause per family."""
    reasons = []
    for fam in families:
        ok, why = fam.supports(device_index)
        if ok:
            profiled = [None] * len(problems) if configs is not None else [_profiled(fam, p, profile) for p in problems]
            if configs is None and any(profiled) and not fam.plan_rules(tuple(profiled))[0]:
                profiled = [None] * len(problems)  # the profile's entries do not pair up (one launch): heuristics
            chosen = configs if configs is not None else \
                [c or fam.heuristic(p, sm_count(device_index)) for c, p in zip(profiled, problems)]
            for config, problem in zip(chosen, problems):
                ok, why = (False, "its heuristic passes") if config is None else fam.can_implement(config, problem)
                if not ok:
                    break
            if ok:  # configs that bind the projections (moe_gemv's one launch) come in matching pairs
                ok, why = fam.plan_rules(tuple(chosen))
        if ok and stacked is not None:  # after the family's own rules (layout first: the likelier reason)
            ok, why = False, stacked
        if ok:
            kinds = {"heuristic" if c is None else "profile" for c in profiled}
            source = "configs argument" if configs is not None else "+".join(sorted(kinds, reverse=True))
            return GroupedPlan((fam, fam), chosen, device_index, source=source)
        reasons.append(f"{fam.name}: {why}")
    return "; ".join(reasons)


def _near(hit, problem: MoeProblem) -> bool:
    """Was ``hit`` (a ``lookup_grouped`` answer) measured within a factor of two of the problem's
    tokens? Farther off, a profile measured at a few token counts only (a 1-8-token sweep of one
    width) would hand its decode schedules to a batch or a prompt; the heuristics decide there."""
    return hit is not None and abs(math.log2(hit[0]) - math.log2(max(1, problem.tokens))) <= 1


def _near_profiled(problems, profile, device_index: int):
    """The profile's configs for both projections when both were measured within a factor of two
    of these tokens and each can run here (its family on this device, its rules); else None."""
    chosen = []
    for problem in problems if profile is not None else ():
        hit = profile.lookup_grouped(problem)
        if not _near(hit, problem):
            return None
        try:
            config = parse_schedule(hit[1], **problem.kind)
        except ValueError:
            return None
        fam = family_of(config)
        if fam not in GROUPED_FAMILIES or not fam.supports(device_index)[0] or not fam.can_implement(config, problem)[0]:
            return None
        chosen.append(config)
    return chosen if chosen and _pair_reason(chosen) is None else None


def _profiled(fam, problem: MoeProblem, profile):
    """The profile's schedule of ``fam`` for ``problem`` (nearest measured token bucket of the same
    experts, shape and kind, within a factor of two: :func:`_near`), when it can run it; else None
    (the family's heuristic decides)."""
    hit = None if profile is None else profile.lookup_grouped(problem)
    if not _near(hit, problem):
        return None
    try:
        config = parse_schedule(hit[1], **problem.kind)
    except ValueError:
        return None
    return config if family_of(config) is fam and fam.can_implement(config, problem)[0] else None


def _family_of_configs(configs):
    fams = {family_of(c) for c in configs}
    if len(configs) != 2 or len(fams) != 1 or not set(GROUPED_FAMILIES) >= fams:
        raise ValueError("configs: expected (gate|up config, down config) of grouped families")
    return fams.pop()


def _mixed_plan(configs, problems, stacked: Optional[str], device_index: int) -> Union[GroupedPlan, str]:
    """Forced configs of two grouped families (as a profile's two entries may pair them), or why
    they cannot run here."""
    if len(configs) != 2 or not set(GROUPED_FAMILIES) >= {family_of(c) for c in configs}:
        raise ValueError("configs: expected (gate|up config, down config) of grouped families")
    for config, problem in zip(configs, problems):
        why = _config_reason(config, problem, stacked, device_index)
        if why is not None:
            return f"{family_of(config).name}: {why}"
    why = _pair_reason(configs)
    if why is not None:
        return why
    return GroupedPlan([family_of(c) for c in configs], list(configs), device_index, source="configs argument")


def _down_weights(down, topk_weights: torch.Tensor) -> torch.Tensor:
    """The top-k weights as the down launcher reads them: as they are where it says it reads them
    (``reads``: moe_gemv's pair and persistent modes take a router's fp16/bf16 scores, saving a cast
    launch a layer), else fp32 (applied in fp32 either way)."""
    reads = getattr(down, "reads", None)
    if reads is not None and reads(topk_weights):
        return topk_weights
    return topk_weights.to(torch.float32).contiguous()


def run_grouped(launchers, x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> torch.Tensor:
    """The two grouped launches on the current stream: h = SiLU(gate) * up (``(T * k, I)``, the
    activation dtype), then y. No host read of the routing; allocations come from torch's
    allocator (a CUDA graph's pool under capture)."""
    tokens, top_k = topk_ids.shape
    if not x.is_contiguous() or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # rows are read 16 bytes at a time
    ids = topk_ids.contiguous()
    weights = _down_weights(launchers[1], topk_weights)
    h = torch.empty((tokens * top_k, w2.k), dtype=x.dtype, device=x.device)
    y = torch.empty((tokens, x.shape[1]), dtype=x.dtype, device=x.device)
    stream = current_stream(x.device.index)
    gate_up, down = launchers
    if getattr(gate_up, "one_launch", False):  # moe_gemv's one-launch mode: both projections, h never leaves it
        gate_up.launch_layer(down, x, w13, w2, ids, weights, h, y, tokens, top_k, stream)
        return y
    # Launchers of the families that sort the pairs (moe_sm90a, moe_sm80) sort them once (the gate|up
    # launcher's route kernels, with the tile prefix sums both need) and keep h in that order.
    handover = {}
    if all(getattr(f, "sorted_pairs", False) for f in launchers):
        heights = tile_heights(gate_up.tile_rows, down.tile_rows)
        handover = {"sorted_h": True, "routing": gate_up.route(ids, w13.num_experts, heights, stream)}
    gate_up(x, w13, ids, None, h, tokens, top_k, stream, **handover)
    # PDL: the down kernel starts while gate|up runs and waits for h
    down(h, w2, ids, weights, y, tokens, top_k, stream, **handover, **_down_pdl(down))
    return y


def moe_grouped(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, configs=None) -> torch.Tensor:
    """:func:`moe` through the grouped kernels, whatever the token count (tests, benchmarks):
    ``configs`` = (gate|up config, down config) forces them. ``ValueError`` naming why when no
    grouped family can run these experts (or the forced configs cannot)."""
    check_moe_inputs(x, w13, w2, topk_weights, topk_ids)
    if not x.is_cuda:
        raise ValueError(f"x: the grouped kernels run on a CUDA device, got {x.device}")
    if not topk_ids.numel():
        return torch.zeros_like(x)
    plan = grouped_plan(x, w13, w2, topk_ids.shape[1], configs)
    if isinstance(plan, str):
        raise ValueError(f"mixed_gemm.moe: no grouped kernel family can run these experts: {plan}")
    with blocking():  # compile here if need be: the caller asked for these kernels
        launchers = plan.launchers(torch.cuda.is_current_stream_capturing())
    if launchers is None:
        raise ValueError(f"mixed_gemm.moe: the grouped kernels {plan!r} are not available (MIXED_GEMM_JIT=off)")
    return run_grouped(launchers, x, w13, w2, topk_weights, topk_ids)
