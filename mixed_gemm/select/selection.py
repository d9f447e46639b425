"""Pick the kernel of one problem: override, then profile, then heuristics, each filtered by the
family's ``supports`` and ``can_implement``; and the one cache of those picks.

Selection runs once per (weight signature, M bucket); :func:`selected` keeps the answer, so the
hot path of ``matmul`` is one dict lookup.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from typing import Dict, Optional, Tuple

from ..compile import background, jit_mode
from ..kernels import FAMILIES, Family, Problem, family, family_of, parse_schedule, qualified
from .heuristics import heuristic_choice, m_bucket, sm_count
from .profiles import device_profile

SCHEDULE_ENV = "MIXED_GEMM_SCHEDULE"
MAX_BORROW_OCTAVES = 2  # a profile entry serves M buckets up to 4x from its own
log = logging.getLogger(__name__)


class Choice:
    """What runs for a problem: ``family``, ``config``, ``schedule`` (``"family:schedule"``) and
    ``source`` (``"override"``, ``"profile <file> M=<bucket>"`` or ``"heuristic"``).
    ``launch(x, w, bias, y, m, stream, residual=None)`` loads the kernel on first use.

    A cold call never waits for nvcc (``$MIXED_GEMM_JIT=async``, the default, outside
    :func:`mixed_gemm.compile.blocking`): when the chosen kernel is neither packaged nor cached,
    it compiles in the background while a kernel available now runs (``standin``: another
    family's pick, else dequantize + cuBLAS); the first call after the build lands switches to it
    (never during CUDA-graph capture). ``running`` says which is in use."""

    __slots__ = ("family", "config", "source", "device_index", "problem", "standin", "_launch", "_pending")

    def __init__(self, family: Family, config, source: str, device_index: int, problem: Optional[Problem] = None):
        self.family, self.config, self.source, self.device_index = family, config, source, device_index
        self.problem = problem
        self.standin = None  # (family, config) running while the chosen kernel compiles
        self._launch = None
        self._pending = None

    @property
    def schedule(self) -> str:
        return qualified(self.config)

    @property
    def running(self) -> str:
        """``"family:schedule"`` of the kernel calls run now (the stand-in's while one runs)."""
        return qualified(self.standin[1]) if self.standin is not None else self.schedule

    def launch(self, x, w, bias, y, m: int, stream: int, residual=None) -> None:
        fn = self._launch
        if fn is None or self._pending is not None:
            fn = self._resolve()
        fn(x, w, bias, y, m, stream, residual)

    def _resolve(self):
        with _RESOLVE_LOCK:
            if self._launch is None:
                self._launch = self._first()
            elif self._pending is not None and self._pending.done() and not _capturing():
                if self._pending.exception() is None:
                    self._launch = self.family.launcher(self.config, self.device_index)  # verified on load
                    self.standin = None
                else:
                    log.warning("%s could not be built (%s); %s keeps running", self.config.kernel_name,
                                self._pending.exception(), self.running)
                self._pending = None
            return self._launch

    def _first(self):
        if (jit_mode() != "async" or self.source in _EXPLICIT or self.problem is None
                or self.family.ready(self.config)):
            return self.family.launcher(self.config, self.device_index)
        standin = _standin(self.problem, self.device_index, self.config)
        if standin is None:  # the chosen kernel is the cheapest there is
            return self.family.launcher(self.config, self.device_index)
        self._pending = background.submit(self.family.build_spec(self.config))
        self.standin = standin
        log.info("%s is compiling in the background; %s runs meanwhile", self.config.kernel_name, self.running)
        return standin[0].launcher(standin[1], self.device_index)

    def __repr__(self) -> str:
        extra = f", running={self.running!r}" if self.standin is not None else ""
        return f"Choice(family={self.family.name!r}, schedule={self.schedule!r}, source={self.source!r}{extra})"


_EXPLICIT = ("override", "config argument")  # the caller asked for exactly this kernel: compile it
_RESOLVE_LOCK = threading.RLock()


def _capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _standin(problem: Problem, device_index: int, chosen) -> Optional[Tuple[Family, object]]:
    """A kernel to run while ``chosen`` compiles: the first family heuristic pick (in priority order)
    that is packaged or cached, else dequantize + cuBLAS (a small fatbin, compiled now if need be).
    None when ``chosen`` is that dequantize kernel itself."""
    sms = sm_count(device_index)
    for fam in FAMILIES:
        if not fam.supports(device_index)[0] or not fam.reads_weight(problem)[0]:
            continue
        config = fam.heuristic(problem, sms)
        if config is None or config.kernel == chosen.kernel or not fam.can_implement(config, problem)[0]:
            continue
        if fam.ready(config):
            return fam, config
    fam = family("dequant_mm")
    config = fam.heuristic(problem, sms)
    return None if config.kernel == chosen.kernel else (fam, config)


def _usable(fam: Family, config, problem: Problem, device_index: int, capability=None) -> Tuple[bool, str]:
    ok, why = fam.supports(device_index) if capability is None else fam.runs_on(capability)
    return fam.can_implement(config, problem) if ok else (ok, why)


_DEVICE = object()  # choose(profile=...): the device's own profile


def choose(problem: Problem, device_index: int, *, capability: Optional[Tuple[int, int]] = None,
           sms: Optional[int] = None, profile=_DEVICE, override: bool = True) -> Choice:
    """The kernel for ``problem`` on ``device_index``:

    1. ``$MIXED_GEMM_SCHEDULE`` (``family:schedule``, or a bare sm80 schedule) for every weight
       (sweeps, debugging); an override that cannot run raises;
    2. the GPU's profile (:mod:`mixed_gemm.select.profiles`), nearest measured M bucket;
    3. the families' heuristics in priority order (:func:`heuristic_choice`).

    Raises ``ValueError`` listing each family's reason when nothing fits. ``capability``,
    ``sms`` and ``profile`` choose for a GPU of that kind rather than device ``device_index``'s,
    and ``override=False`` ignores step 1 (what a kernel package built for an arch must hold:
    :mod:`.coverage`).
    """
    kind = problem.kind
    forced = os.environ.get(SCHEDULE_ENV) if override else None
    if forced:
        try:
            config = parse_schedule(forced, **kind)
        except ValueError as exc:
            raise ValueError(f"{SCHEDULE_ENV}: {exc}") from None
        fam = family_of(config)
        ok, why = _usable(fam, config, problem, device_index, capability)
        if not ok:
            raise ValueError(f"{SCHEDULE_ENV}={forced}: {fam.name} cannot run this problem: {why}")
        return Choice(fam, config, "override", device_index, problem)
    reasons = []
    sms = sm_count(device_index) if sms is None else sms
    profile = device_profile(device_index) if profile is _DEVICE else profile
    if profile is not None:
        key = (problem.dtype, problem.bits, problem.zero_mode, problem.group_size, problem.n, problem.k)
        name = profile.path.name if profile.path is not None else "profile"
        # This shape's entry at M's own bucket, else the nearest profiled shape's (same bit width) at
        # that bucket that can serve this weight, else the nearest measured bucket of this shape, then
        # of the nearest shapes. An entry measured at this M beats one of this shape at another M:
        # the best family changes with M (a profile extended at large M for one model's shapes
        # serves the others there). No entry serves an M more than MAX_BORROW_OCTAVES from its own
        # bucket (a decode kernel measured at 32 tokens says nothing of 300): the heuristics do.
        want = m_bucket(problem.m)
        tried = set()
        order = ([(key, True)] + [(near, True) for near in profile.nearest_shapes(key, want)] + [(key, False)]
                 + [(near, False) for near in profile.nearest_shapes(key)])
        for shape_key, exact in order:
            hit = None if shape_key is None else profile.lookup(shape_key, problem.m)
            if (hit is None or (exact and hit[0] != want) or (shape_key, hit[0]) in tried
                    or abs(math.log2(hit[0] / want)) > MAX_BORROW_OCTAVES):
                continue
            tried.add((shape_key, hit[0]))
            bucket, schedule = hit
            config = parse_schedule(schedule, **kind)
            fam = family_of(config)
            config = fam.for_layout(config, problem)
            if shape_key != key:  # borrowed from a similar shape: fit its launch to this one
                at = dataclasses.replace(problem, m=bucket)
                config = fam.refit(config, at, sms, dataclasses.replace(at, n=shape_key[4], k=shape_key[5]))
            ok, why = _usable(fam, config, problem, device_index, capability)
            where = f"profile {name} M={bucket}" + ("" if shape_key == key else f" of {shape_key[4]}x{shape_key[5]}")
            if ok:
                return Choice(fam, config, where, device_index, problem)
            reasons.append(f"{where} entry {schedule}: {why}")
    picked, why_not = heuristic_choice(problem, device_index, capability=capability, sms=sms)
    if picked is not None:
        return Choice(picked[0], picked[1], "heuristic", device_index, problem)
    raise ValueError(f"no kernel family can run M={problem.m} N={problem.n} K={problem.k} "
                     f"{problem.dtype}/{problem.bits}-bit/{problem.zero_mode} group {problem.group_size} "
                     f"({problem.layout} layout) on cuda:{device_index}: " + "; ".join(reasons + why_not))


# (weight signature, M bucket) -> Choice. The signature holds the device, so choices never cross GPUs.
SELECTED: Dict[Tuple, Choice] = {}  # read by matmul's hot path; written only here
_FORCED: Dict[Tuple, Choice] = {}
_LOCK = threading.Lock()


def selected(signature: Tuple, bucket: int, problem: Problem, device_index: int) -> Choice:
    """The cached choice of ``(signature, bucket)``, choosing (for ``problem``) on a miss."""
    key = (signature, bucket)
    choice = SELECTED.get(key)
    if choice is None:
        choice = choose(problem, device_index)
        with _LOCK:
            choice = SELECTED.setdefault(key, choice)
    return choice


def forced(config, problem: Problem, device_index: int) -> Choice:
    """The choice for an explicit ``config`` (``matmul(config=...)``), checked against ``problem``."""
    fam = family_of(config)
    ok, why = _usable(fam, config, problem, device_index)
    if not ok:
        raise ValueError(f"config: {config.name} cannot run this problem: {why}")
    key = (config, device_index)
    choice = _FORCED.get(key)
    if choice is None:
        with _LOCK:
            choice = _FORCED.setdefault(key, Choice(fam, config, "config argument", device_index))
    return choice


def clear_selection() -> None:
    """Forget every cached choice (after changing ``$MIXED_GEMM_SCHEDULE`` or a profile)."""
    with _LOCK:
        SELECTED.clear()
        _FORCED.clear()
