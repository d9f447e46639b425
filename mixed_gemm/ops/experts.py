"""Mixture-of-experts weights and layer (issue #24): ``E`` experts' weights as one stacked prepacked
copy, and ``moe``: gate|up GEMM, SiLU(gate) * up, down GEMM, weighted sum over the top-k.

Layout contract (:class:`PackedExperts`): expert ``e``'s weight is exactly the :class:`PackedWeight`
that :func:`prepack` makes for its ``(N, K)`` matrix, and the stacked tensors hold those
PackedWeights' tensors along a new leading dimension: ``b[e]``, ``scales[e]``, ``zeros[e]`` (each
``PackedWeight``'s shapes, contiguous, so expert ``e`` starts ``e * b[0].numel()`` elements into
``b``). A grouped kernel reads expert ``e`` at that stride; :meth:`PackedExperts.expert` is the same
expert as a zero-copy PackedWeight, which every dense family runs.

``w13`` is each expert's gate|up projection ``(2I, H)``, packed with ``gate_up=True``: the caller
gives its gate rows ``[0, I)`` then its up rows ``[I, 2I)`` (transformers' ``gate_up_proj``, vLLM's
``w13``) and the stack stores them interleaved in blocks of ``GATE_UP_BLOCK`` = 8: stored rows
``16 j .. 16 j + 7`` are gate rows ``8 j .. 8 j + 7`` and stored rows ``16 j + 8 .. 16 j + 15`` the
matching up rows (``I`` a multiple of 8). Why: every gated kernel then finds gate row ``i`` and up
row ``i`` in one thread's accumulators (an mma or wgmma accumulator holds rows ``r`` and ``r + 8``
of a 16-row block), so SiLU(gate) * up is formed in the GEMM's epilogue and only ``h (pairs, I)``
is written. :meth:`PackedExperts.expert` is the stored (interleaved) weight;
:meth:`PackedExperts.unpack_expert` and :meth:`PackedExperts.dequantize` give gate then up rows.
``w2`` is the down projection ``(H, I)``, stored as given.

Execution: on the CPU the float32 reference (:func:`mixed_gemm.reference.moe` of the dequantized
experts). On a GPU, the grouped path when a grouped family (``kernels.GROUPED_FAMILIES``) can take
the experts (the ``sm90a`` layout, 4/8 bits): on an H100, once the routed experts get many pairs
each, ``moe_sm90a`` (pairs sorted by expert on the device, one grouped wgmma GEMM per projection
over every expert's rows, SiLU(gate) * up in the gate|up GEMM's epilogue, the top-k sum after
down; ``moe_sm80`` likewise with mma.sync tiles on Ampere); otherwise ``moe_gemv``
(the decode kernels, "pair mode" at one token, "expert mode" once experts get several pairs; ``I``
a multiple of 16): two launches, gate|up with SiLU(gate) * up fused, then down with the top-k
weighted sum fused. The profile's grouped entries, where they were measured near this token
count, say which kernels run (the two projections' may be of different families); else the
families are asked in that order. Neither reads the
routing on the host, so both run under CUDA-graph capture. Outside capture it runs while it pays (every
decode-size ``T``, up to 256 tokens, and above that while ``T * top_k`` is at most a few times
``E``: ``moe_gemv.heuristics.pays``); otherwise, and for what no grouped family takes
(``sm80``-layout experts), one gate|up and one down :func:`matmul` per expert that got tokens
(:func:`per_expert`). Finding those experts reads the routing on the host, so that path cannot be
captured; it says so.

Rounding (grouped path): the gate and up dot products accumulate in float32, ``silu(g) * u`` is
computed in float32 and rounded once to the activation dtype (the intermediate ``h``; the tile
families, moe_sm90a and moe_sm80, round ``g`` and ``u`` to the activation dtype first); the down
dot products accumulate in float32, each slot's is multiplied by its top-k weight in float32, the
slots are added in slot order (deterministic, no atomics), and ``y`` is rounded once.
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import torch

from ..compile import JitDisabledError, background, blocking, jit_mode
from ..kernels import GROUPED_FAMILIES, MoeProblem, family_of, parse_schedule
from ..kernels.base import sm_count
from ..kernels.common import GATE_UP_BLOCK
from ..runtime import current_stream
from ..select import device_profile, m_bucket
from .matmul import matmul
from .packed import KERNEL_DTYPES, PackedWeight, prepack

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackedExperts:
    """``E`` experts' ``(N, K)`` weights, stacked (module docstring: the layout contract)."""

    b: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    n: int
    k: int
    bits: int
    group_size: int
    zero_mode: str
    layout: str
    gate_up: bool = False  # rows interleaved gate|up in blocks of GATE_UP_BLOCK (module docstring)

    @property
    def num_experts(self) -> int:
        return self.b.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.b.device

    @property
    def signature(self) -> Tuple:
        """What the choice of a grouped kernel depends on (kind, shape, layout, device)."""
        return (self.num_experts, self.n, self.k, self.bits, self.group_size, self.zero_mode, self.dtype, self.layout,
                self.gate_up, self.device.index)

    def expert(self, e: int) -> PackedWeight:
        """Expert ``e`` as a PackedWeight over the stacked tensors (no copy), rows as stored: a
        ``gate_up`` stack's are interleaved (:func:`split_gate_up` splits its products)."""
        return PackedWeight(b=self.b[e], scales=self.scales[e], zeros=None if self.zeros is None else self.zeros[e],
                            n=self.n, k=self.k, bits=self.bits, group_size=self.group_size,
                            zero_mode=self.zero_mode, perm=None, layout=self.layout, aux=())

    def unpack_expert(self, e: int):
        """Expert ``e``'s canonical ``(q, s, z)`` (``PackedWeight.unpack``), gate rows then up rows
        for a ``gate_up`` stack."""
        q, s, z = self.expert(e).unpack()
        if self.gate_up:
            q, s = gate_up_halves(q), gate_up_halves(s)
            z = None if z is None else gate_up_halves(z)
        return q, s, z

    def dequantize(self) -> torch.Tensor:
        """float32 ``(E, N, K)``: every expert's weight (gate rows then up rows), for the reference."""
        from ..reference import dequantize

        out = []
        for e in range(self.num_experts):
            q, s, z = self.unpack_expert(e)
            out.append(dequantize(q, s, z, group_size=self.group_size if s.shape[-1] > 1 else -1, bits=self.bits,
                                  zero_mode="offset" if self.zero_mode == "offset" else "int"))
        return torch.stack(out)


def gate_up_interleaved(t: torch.Tensor) -> torch.Tensor:
    """Rows (dim -2) ``[gate (I); up (I)]`` of ``t`` into the stored order of a ``gate_up`` stack."""
    *lead, n, cols = t.shape
    return t.reshape(*lead, 2, n // (2 * GATE_UP_BLOCK), GATE_UP_BLOCK, cols).transpose(-4, -3).reshape(t.shape)


def gate_up_halves(t: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`gate_up_interleaved`: stored rows back to gate rows then up rows."""
    *lead, n, cols = t.shape
    return t.reshape(*lead, n // (2 * GATE_UP_BLOCK), 2, GATE_UP_BLOCK, cols).transpose(-4, -3).reshape(t.shape)


def split_gate_up(h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)``, each ``(..., I // 8, 8)`` views, of a product ``h (..., 2I)`` with a
    ``gate_up`` stack's expert (columns in the stored, interleaved order)."""
    blocks = h.reshape(*h.shape[:-1], h.shape[-1] // (2 * GATE_UP_BLOCK), 2, GATE_UP_BLOCK)
    return blocks[..., 0, :], blocks[..., 1, :]


def prepack_experts(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], *, bits: int = 4,
                    group_size: int = 128, zero_mode: str = "int", dtype: torch.dtype = torch.float16,
                    layout: str = "auto", gate_up: bool = False) -> PackedExperts:
    """Canonical per-expert ``q`` ``(E, N, K)``, ``s``/``z`` ``(E, N, num_groups)`` (``z``: ``None``
    for symmetric weights), as :func:`mixed_gemm.quantize` makes them expert by expert, into one
    :class:`PackedExperts` on their device. Each expert goes through :func:`prepack` (its rules and
    errors); ``layout`` as there (one layout: a grouped kernel reads one), except that ``"auto"``
    takes the grouped families' layout on a GPU where one of them runs (:func:`experts_layout`:
    on Ampere too, where dense weights get the sm80 layout). ``gate_up=True`` for ``moe``'s ``w13``:
    the rows are gate rows then up rows (``N = 2I``, ``I`` a multiple of 8), stored interleaved
    (module docstring)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected (E, N, K) codes, got shape {tuple(q.shape)}")
    if layout not in ("auto", "sm80", "sm90a"):
        raise ValueError(f"layout: experts hold one layout, 'auto', 'sm80' or 'sm90a'; got {layout!r}")
    if gate_up:
        if q.shape[1] % (2 * GATE_UP_BLOCK):
            raise ValueError(f"q: a gate|up stack (gate_up=True) has 2I rows with I a multiple of {GATE_UP_BLOCK} "
                             f"(gate and up rows are stored in interleaved blocks of {GATE_UP_BLOCK}), got N={q.shape[1]}")
        if s.dim() != 3 or s.shape[1] != q.shape[1] or (z is not None and z.shape[:2] != s.shape[:2]):
            raise ValueError(f"s, z: expected (E, N={q.shape[1]}, num_groups) like q's rows, got "
                             f"{tuple(s.shape)} and {None if z is None else tuple(z.shape)}")
        q, s = gate_up_interleaved(q), gate_up_interleaved(s)
        z = None if z is None else gate_up_interleaved(z)
    if layout == "auto":
        layout = experts_layout(q.device)
    parts = [prepack(q[e], s[e], None if z is None else z[e], format="plain", bits=bits, group_size=group_size,
                     zero_mode=zero_mode, dtype=dtype, layout=layout) for e in range(q.shape[0])]
    first = parts[0]
    return PackedExperts(b=torch.stack([p.b for p in parts]), scales=torch.stack([p.scales for p in parts]),
                         zeros=None if first.zeros is None else torch.stack([p.zeros for p in parts]),
                         n=first.n, k=first.k, bits=first.bits, group_size=first.group_size,
                         zero_mode=first.zero_mode, layout=first.layout, gate_up=gate_up)


def experts_layout(device: torch.device) -> str:
    """The layout ``prepack_experts(layout="auto")`` gives experts on ``device``: the one the first
    grouped family that runs there reads (``sm90a``: moe_sm90a on the H100, moe_gemv's mma.sync
    kernels from compute capability 8.0, which also read it), so that ``moe`` has a grouped,
    capturable path; ``"auto"`` (prepack's choice) elsewhere. Dense selection serves either layout
    (the per-expert path: gemv at decode sizes, dequantize + cuBLAS above)."""
    if device.type != "cuda":
        return "auto"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return next((fam.layout for fam in GROUPED_FAMILIES if fam.supports(index)[0]), "auto")


def _check(x, w13: PackedExperts, w2: PackedExperts, topk_weights, topk_ids) -> None:
    """The rules, each a ValueError/TypeError naming the argument, before anything runs."""
    if not isinstance(w13, PackedExperts) or not isinstance(w2, PackedExperts):
        raise TypeError(f"w13, w2: expected PackedExperts (mixed_gemm.prepack_experts), got "
                        f"{type(w13).__name__} and {type(w2).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a (T, H) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    t, h = x.shape
    if not w13.gate_up:
        raise ValueError("w13: expected a gate|up stack, prepack_experts(..., gate_up=True) (gate and up rows "
                         f"interleaved in blocks of {GATE_UP_BLOCK}, the order the gated kernels read), got plain rows")
    if w2.gate_up:
        raise ValueError("w2: the down projection is stacked with plain rows (prepack_experts' gate_up=False)")
    inter = w13.n // 2
    if w13.k != h:
        raise ValueError(f"w13: expected K = H = {h} (x's last dimension), got K={w13.k}")
    if (w2.num_experts, w2.n, w2.k) != (w13.num_experts, h, inter):
        raise ValueError(f"w2: expected (E, H, I) = ({w13.num_experts}, {h}, {inter}) to match w13 and x, got "
                         f"({w2.num_experts}, {w2.n}, {w2.k})")
    if x.dtype != w13.dtype or w2.dtype != w13.dtype:
        raise TypeError(f"x: dtype must equal the experts' ({w13.dtype}), got x {x.dtype}, w2 {w2.dtype}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids, topk_weights: expected equal (T={t}, top_k) shapes, got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected int32 or int64 expert ids, got {topk_ids.dtype}")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights: expected floating point, got {topk_weights.dtype}")
    for name, tensor in (("w13", w13.b), ("w2", w2.b), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if tensor.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (same as x), got {tensor.device}")


def moe(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """A SiLU-gated mixture-of-experts layer: for each token ``t``,
    ``y[t] = sum_j topk_weights[t, j] * W2[e] @ (silu(gate_e x_t) * up_e x_t)`` with
    ``e = topk_ids[t, j]`` and ``gate_e``/``up_e`` the two halves of ``W13[e]``.

    ``x`` ``(T, H)`` float16/bfloat16 (the experts' dtype), ``w13`` ``(E, 2I, H)`` and ``w2``
    ``(E, H, I)`` :class:`PackedExperts`, ``topk_weights`` float ``(T, k)``, ``topk_ids`` int
    ``(T, k)`` in ``[0, E)``. Returns ``(T, H)`` in ``x``'s dtype (module docstring: which path runs
    and where it rounds). Expert ids out of range raise ``ValueError`` on the CPU and on the
    per-expert path; the grouped path does not check them (that would read the routing on the
    host): a pair whose id lies outside ``[0, E)`` contributes nothing there, never reading out of
    bounds."""
    _check(x, w13, w2, topk_weights, topk_ids)
    if not topk_ids.numel():  # no tokens (or top_k = 0): nothing to route
        return torch.zeros_like(x)
    if x.is_cuda:
        capturing = torch.cuda.is_current_stream_capturing()
        plan = grouped_plan(x, w13, w2, topk_ids.shape[1])
        if isinstance(plan, GroupedPlan) and (capturing or plan.pays(x.shape[0], topk_ids.shape[1], w13.num_experts)):
            launchers = plan.launchers(capturing)
            if launchers is not None:
                return _run_grouped(launchers, x, w13, w2, topk_weights, topk_ids)
        if capturing:  # before any host read of the routing
            why = plan if isinstance(plan, str) else "its kernels are not available (MIXED_GEMM_JIT=off)"
            raise RuntimeError("mixed_gemm.moe: the per-expert path runs one GEMM pair per routed expert and reads the "
                               "routing on the host, which a CUDA graph cannot capture; the grouped kernels, which can, "
                               f"cannot run these experts: {why}")
    e_count = w13.num_experts
    flat = topk_ids.reshape(-1)
    # One host read: the ids' range and each expert's pair count (ids clamped for the count only).
    stats = torch.cat([flat.min().view(1), flat.max().view(1),
                       torch.bincount(flat.clamp(0, e_count - 1), minlength=e_count)]).tolist()
    lo, hi, counts = stats[0], stats[1], stats[2:]
    if lo < 0 or hi >= e_count:
        raise ValueError(f"topk_ids: expert ids must lie in [0, {e_count}) (E), got {lo if lo < 0 else hi}")
    if x.device.type != "cuda":
        from ..reference import moe as reference_moe

        return reference_moe(x.float(), w13.dequantize(), w2.dequantize(), topk_weights.float(), topk_ids).to(x.dtype)
    inter = w13.n // 2

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = split_gate_up(matmul(rows, w13.expert(e)))
        return matmul((torch.nn.functional.silu(gate) * up).reshape(rows.shape[0], inter), w2.expert(e))

    return per_expert(x, topk_weights, topk_ids, counts, expert)


class GroupedPlan:
    """The grouped kernels of one ``(w13, w2, top_k, T bucket, device)``: a config per projection
    (``configs`` = (gate|up, down)), each of a grouped family (``families``; the two may differ: every
    grouped family hands the down projection ``h`` in the same (pair, I) rows), chosen once
    (:func:`grouped_plan`), their launchers loaded on first use. :meth:`pays` says whether to run
    them outside capture."""

    __slots__ = ("families", "configs", "device_index", "_launchers", "_lock")

    def __init__(self, families, configs, device_index: int):
        self.families, self.configs, self.device_index = tuple(families), tuple(configs), device_index
        self._launchers = None
        self._lock = threading.Lock()

    @property
    def family(self):
        """The gate|up projection's family (the down projection's too, unless a profile mixed them)."""
        return self.families[0]

    def pays(self, tokens: int, top_k: int, experts: int) -> bool:
        return all(f.pays(tokens, top_k, experts) for f in self.families)

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
        return f"GroupedPlan(schedules={[f'{f.name}:{c.schedule}' for f, c in zip(self.families, self.configs)]!r})"


# (w13 signature, w2 signature, top_k, T bucket) -> GroupedPlan, or the reason no grouped family runs it
GROUPED: Dict[Tuple, Union[GroupedPlan, str]] = {}
_GROUPED_LOCK = threading.Lock()


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
    ``configs`` = (gate|up config, down config) forces the kernels (tests, sweeps; not cached)."""
    tokens = x.shape[0]
    device_index = x.device.index if x.is_cuda else 0  # (a CPU x: what device 0 would run, for tests)
    key = (w13.signature, w2.signature, top_k, m_bucket(max(1, tokens)), device_index)
    plan = GROUPED.get(key) if configs is None else None
    if plan is not None:
        return plan
    problems = _problems(m_bucket(max(1, tokens)), top_k, w13, w2)
    profile = device_profile(device_index) if x.is_cuda and configs is None else None
    stacked = _stacked_reason(w13, w2)
    near = None if configs is not None or stacked is not None else _near_profiled(problems, profile, device_index)
    if near is not None:  # the profile measured both projections near these tokens: its kernels, whichever families
        plan = GroupedPlan([family_of(c) for c in near], near, device_index)
    else:
        plan = _family_plan(GROUPED_FAMILIES if configs is None else (_family_of_configs(configs),), problems,
                            configs, profile, stacked, device_index)
    if configs is None:
        with _GROUPED_LOCK:
            plan = GROUPED.setdefault(key, plan)
    return plan


def _family_plan(families, problems, configs, profile, stacked: Optional[str],
                 device_index: int) -> Union[GroupedPlan, str]:
    """The first of ``families`` whose configs (``configs``, else the profile's nearest of its own or
    its heuristic's) run both projections here, or the reasons none does, one clause per family."""
    reasons = []
    for fam in families:
        ok, why = fam.supports(device_index)
        if ok:
            chosen = configs if configs is not None else \
                [_profiled(fam, p, profile) or fam.heuristic(p, sm_count(device_index)) for p in problems]
            for config, problem in zip(chosen, problems):
                ok, why = (False, "its heuristic passes") if config is None else fam.can_implement(config, problem)
                if not ok:
                    break
        if ok and stacked is not None:  # after the family's own rules (layout first: the likelier reason)
            ok, why = False, stacked
        if ok:
            return GroupedPlan((fam, fam), chosen, device_index)
        reasons.append(f"{fam.name}: {why}")
    return "; ".join(reasons)


def _near_profiled(problems, profile, device_index: int):
    """The profile's configs for both projections when both were measured within a factor of two
    of these tokens and each can run here (its family on this device, its rules); else None."""
    chosen = []
    for problem in problems if profile is not None else ():
        hit = profile.lookup_grouped(problem)
        if hit is None or abs(math.log2(hit[0]) - math.log2(max(1, problem.tokens))) > 1:
            return None
        try:
            config = parse_schedule(hit[1], **problem.kind)
        except ValueError:
            return None
        fam = family_of(config)
        if fam not in GROUPED_FAMILIES or not fam.supports(device_index)[0] or not fam.can_implement(config, problem)[0]:
            return None
        chosen.append(config)
    return chosen or None


def _profiled(fam, problem: MoeProblem, profile):
    """The profile's schedule of ``fam`` for ``problem`` (nearest measured token bucket of the same
    experts, shape and kind), when it can run it; else None (the family's heuristic decides)."""
    hit = None if profile is None else profile.lookup_grouped(problem)
    if hit is None:
        return None
    try:
        config = parse_schedule(hit[1], **problem.kind)
    except ValueError:
        return None
    return config if family_of(config) is fam and fam.can_implement(config, problem)[0] else None


def _family_of_configs(configs):
    fams = {family_of(c) for c in configs}
    if len(configs) != 2 or len(fams) != 1 or not set(GROUPED_FAMILIES) >= fams:
        raise ValueError("configs: expected (gate|up config, down config) of one grouped family")
    return fams.pop()


def _run_grouped(launchers, x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> torch.Tensor:
    """The two grouped launches on the current stream: h = SiLU(gate) * up (``(T * k, I)``, the
    activation dtype), then y. No host read of the routing; allocations come from torch's
    allocator (a CUDA graph's pool under capture)."""
    tokens, top_k = topk_ids.shape
    if not x.is_contiguous() or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # rows are read 16 bytes at a time
    ids = topk_ids.contiguous()
    weights = topk_weights.to(torch.float32).contiguous()  # applied in fp32
    h = torch.empty((tokens * top_k, w2.k), dtype=x.dtype, device=x.device)
    y = torch.empty((tokens, x.shape[1]), dtype=x.dtype, device=x.device)
    stream = current_stream(x.device.index)
    gate_up, down = launchers
    # Launchers of a family that sorts the pairs (moe_sm90a) keep h in that order between them.
    handover = {"sorted_h": True} if all(getattr(f, "sorted_pairs", False) for f in launchers) else {}
    gate_up(x, w13, ids, None, h, tokens, top_k, stream, **handover)
    down(h, w2, ids, weights, y, tokens, top_k, stream, **handover)
    return y


def moe_grouped(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, configs=None) -> torch.Tensor:
    """:func:`moe` through the grouped kernels, whatever the token count (tests, benchmarks):
    ``configs`` = (gate|up config, down config) forces them. ``ValueError`` naming why when no
    grouped family can run these experts (or the forced configs cannot)."""
    _check(x, w13, w2, topk_weights, topk_ids)
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
    return _run_grouped(launchers, x, w13, w2, topk_weights, topk_ids)


def per_expert(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, counts, expert) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * expert(e, x rows routed to e)`` accumulated in float32, one
    ``expert(e, rows)`` call per expert with pairs (``counts[e]`` of them, read on the host): the
    per-expert loop of transformers' eager experts, for ``moe`` on a GPU and the dense baseline."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        pairs = order[start:start + c]
        start += c
        tokens = pairs // topk_ids.shape[1]
        y = expert(e, x.index_select(0, tokens))
        out.index_add_(0, tokens, y.float() * topk_weights.reshape(-1).index_select(0, pairs).float().unsqueeze(1))
    return out.to(x.dtype)
