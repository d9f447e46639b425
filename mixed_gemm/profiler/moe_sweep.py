"""``mixed-gemm profile-moe``: time every grouped family's candidates for each MoE preset, token count
and projection; write the winner (the fastest of all families) into the GPU's profile (its
``"grouped"`` list, read by ``mixed_gemm.moe``'s plan).

Each stage is timed alone on random int4 (``--bits 8``: int8) g128 experts and random softmax top-k
routing (fixed seeds), replayed from a CUDA graph (median of replays): the gate|up stage on x, the
down stage on the gate|up output of the family's heuristic schedule (or, where that passes, its
first candidate). A candidate counts only when its output matches that schedule's element-wise (fp32
sums in another order, one rounding: ``rtol 2 eps``, ``atol`` grown like sqrt(K)); the heuristic
schedules themselves are checked against the reference in the GPU suite.

A stage timed alone replays its kernel on an L2 that still holds the experts it read (a few MB at
a few tokens), so it can rank plans unlike the layer does. The best pairs (the two stage winners,
the heuristics' pair, the LAYER_TOP fastest of each stage crossed) are therefore timed again as the
layer through ``moe_grouped`` on a cold L2, under the sweep's routing and LAYER_ROUTINGS - 1 more
(an entry serves every routing of its token count, and at a few tokens plans differ in how they
take repeated and untouched experts: one routing ranked a persistent gate|up level with pair mode
where another ran it 11% slower), and the pair with the least total is what both entries name. The
least two and the pair to beat run a runoff (RUNOFF_REPLAYS times the replays, those pairs alone),
and its totals decide: in one timing of ten pairs a pair's layer can spread more than the gains the
check decides between.
With ``--against-profile`` the pair the profile runs now is timed beside them and stays unless
beaten by the margin: Mixtral's down stage alone ranked a K split 1.3 µs ahead of the shipped one
whose layer then ran 2.5-3 µs faster in the bench.

Before timing a preset, every candidate of its token counts is compiled, several nvcc at once
(:func:`candidate_specs`, :mod:`.prebuild`); one at a time as they were timed, a fresh machine
spent minutes per token count in nvcc.

Configs that run both projections in one launch (a family's ``layer_candidates``: moe_gemv's
``_pe1``) cannot be timed a stage at a time: each pair is timed as the layer (its launcher's
``launch_layer``, from a graph), its output checked against the down stage's reference, and it wins
when it beats the two stage winners' times added; both entries then name its pair, each with half
its time.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from .. import _versions
from ..kernels import GROUPED_FAMILIES, MoeProblem, split_schedule
from ..kernels.base import sm_count
from ..ops import prepack_experts
from ..ops.moe_grouped import forced_schedules, grouped_plan, moe_grouped
from ..ops.packed import KERNEL_DTYPES
from ..runtime import current_stream
from ..select import Profile, m_bucket
from ..select.profiles import clear_cache, default_profile_path
from ..version import __version__
from .prebuild import build_candidates
from .problems import MOE_MODELS
from .timing import time_cold, time_graph
from .workload import random_routing

EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
LAYER_ROUTINGS = 3  # routings the layer check times each pair under (the sweep's first)
LAYER_MARGIN = 0.01  # another pair replaces the stage winners only when this much faster in total
# The fastest of each stage crossed in the layer check. Three, not two: on an H200 a one-token down
# kernel third alone (bf16 DeepSeek-V2-Lite, `w2_s1_w1x16_u8_ds_sw`) was 2.5 µs faster in the layer
# than the two ahead of it (docs/notes/moe.md, "The slot-warps down").
LAYER_TOP = 3
RUNNERS_UP = 6  # stage candidates after the winner named in the log, with their times
# The runoff: the two best pairs and the one to beat timed again, alone, with this many times the
# replays, and only that timing decides. At 4096 tokens one pair's layer spread 26 µs over three
# routings (772-798 µs) in a check of ten pairs, which kept the current pair against a down that
# `bench --moe` then read 1.9% faster in three alternated rounds (docs/notes/moe.md).
RUNOFF_PAIRS, RUNOFF_REPLAYS = 2, 3


def _experts(e: int, n: int, k: int, dtype: torch.dtype, seed: int, gate_up: bool = False, bits: int = 4):
    """Random ``bits``-wide g128 experts with integer zeros (AWQ's kind), scaled so that a row's
    dot products stay O(1)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    levels = 1 << bits
    q = torch.randint(0, levels, (e, n, k), generator=gen, dtype=torch.uint8, device="cuda")
    s = ((torch.rand(e, n, k // 128, generator=gen, device="cuda") + 0.5) * (2.0 / (levels * k**0.5))).to(dtype)
    z = torch.randint(0, levels, (e, n, k // 128), generator=gen, device="cuda").to(dtype)
    return prepack_experts(q, s, z, bits=bits, group_size=128, dtype=dtype, layout="sm90a", gate_up=gate_up)


def _routing(tokens: int, shape, gen: torch.Generator):
    """``(topk_ids, fp32 topk_weights)``, contiguous, of a random routing drawn from ``gen``."""
    weights, ids = random_routing(tokens, shape, gen)
    return ids.contiguous(), weights.float().contiguous()


def _agrees(y: torch.Tensor, ref: torch.Tensor, k: int) -> bool:
    ref = ref.float()
    term = ref.pow(2).mean().sqrt().item() / math.sqrt(k)
    atol = 8 * EPS[y.dtype] * math.sqrt(k) * term + 1e-6
    return bool(torch.isfinite(y).all()) and bool(((y.float() - ref).abs() <= atol + 2 * EPS[y.dtype] * ref.abs()).all())


def stage_schedules(fam, problem: MoeProblem, sms: int, families: Optional[Sequence[str]] = None,
                    current: Optional[Profile] = None) -> List[str]:
    """The schedules of ``fam`` to time for ``problem``: all its candidates, or, for a family outside
    ``families``, none; and in either case the schedule ``current`` (the profile swept against) runs
    for the problem now, if it is ``fam``'s, so that a sweep replaces an entry only when faster, and
    the layer check has the incumbent's own stage times (its entries record those, not a guess)."""
    out = list(fam.candidates(problem, sms)) if not families or fam.name in families else []
    entry = current.lookup_grouped(problem) if current is not None else None
    if entry is not None:
        owner, schedule = split_schedule(entry[1])
        if owner.name == fam.name and schedule not in out:
            out.append(schedule)
    return out


def stage_problem(shape, tokens: int, w, stage: str, dtype: torch.dtype, bits: int) -> MoeProblem:
    """The grouped problem of one projection (``w``: its stacked experts) at ``tokens`` (bucketed)."""
    return MoeProblem(tokens=m_bucket(tokens), top_k=shape.top_k, experts=shape.experts, n=w.n, k=w.k,
                      dtype=KERNEL_DTYPES[dtype], bits=bits, zero_mode=w.zero_mode, group_size=128, layout="sm90a",
                      stage=stage, gate_up=w.gate_up)


def stage_configs(fam, problem: MoeProblem, sms: int, families=None, current=None):
    """``(the family's heuristic config or None, its candidate configs that can run problem)``."""
    cands = [fam.from_schedule(sc, **problem.kind) for sc in stage_schedules(fam, problem, sms, families, current)]
    return fam.heuristic(problem, sms), [c for c in cands if fam.can_implement(c, problem)[0]]


def candidate_specs(shape, tokens: Sequence[int], w13, w2, dtype: torch.dtype, bits: int, dev: int, sms: int,
                    families=None, current=None) -> list:
    """The build specs of every kernel :func:`sweep` times for ``shape`` at ``tokens``: each stage's
    candidates and reference (the family's heuristic), and the one-launch pairs."""
    specs = []
    for t in tokens:
        problems = tuple(stage_problem(shape, t, w, stage, dtype, bits) for stage, w in (("w13", w13), ("w2", w2)))
        for fam in GROUPED_FAMILIES:
            if not fam.supports(dev)[0]:
                continue
            for problem in problems:
                own, cands = stage_configs(fam, problem, sms, families, current)
                specs += [fam.build_spec(c) for c in ([own] if own is not None else []) + cands]
            for pair in fam.layer_candidates(problems, sms):
                cfgs = [fam.from_schedule(sc, **p.kind) for sc, p in zip(pair, problems)]
                if all(fam.can_implement(c, p)[0] for c, p in zip(cfgs, problems)) and fam.plan_rules(cfgs)[0]:
                    specs += [fam.build_spec(c) for c in cfgs]
    return specs


def sweep(models: Sequence[str], tokens: Sequence[int], dtype: torch.dtype = torch.float16, replays: int = 7,
          log=print, families: Optional[Sequence[str]] = None, current: Optional[Profile] = None,
          bits: int = 4, jobs: Optional[int] = None) -> List[dict]:
    """Winning grouped entries (profile dicts) for every model x token count x stage; with ``families``,
    only those families' candidates (and ``current``'s entries: :func:`stage_schedules`). Each model's
    candidates are compiled first, ``jobs`` nvcc at a time (:func:`~.prebuild.build_candidates`)."""
    dev = torch.cuda.current_device()
    sms = sm_count(dev)
    stream = current_stream(dev)
    winners = []
    for name in models:
        shape = MOE_MODELS[name]
        w13 = _experts(shape.experts, 2 * shape.inter, shape.hidden, dtype, 13, gate_up=True, bits=bits)
        w2 = _experts(shape.experts, shape.hidden, shape.inter, dtype, 2, bits=bits)
        build_candidates(candidate_specs(shape, tokens, w13, w2, dtype, bits, dev, sms, families, current), jobs,
                         lambda line, name=name: log(f"{name}: {line}"))
        for t in tokens:
            bucket = m_bucket(t)
            gen = torch.Generator().manual_seed(t)
            x = torch.randn(t, shape.hidden, generator=gen).to("cuda", dtype)
            ids, weights = _routing(t, shape, gen)
            pairs = t * shape.top_k
            h = torch.empty((pairs, shape.inter), dtype=dtype, device="cuda")
            y = torch.empty((t, shape.hidden), dtype=dtype, device="cuda")
            problems, stage_best = {}, {}  # stage -> its problem; stage -> (winners index, seconds)
            stage_times, heuristics = {}, {}  # stage -> {"family:schedule": seconds}; stage -> the heuristic's
            for stage, w, src, out, wts in (("w13", w13, x, h, None), ("w2", w2, h, y, weights)):
                problem = stage_problem(shape, t, w, stage, dtype, bits)
                problems[stage] = problem
                times: Dict[str, float] = {}  # "family:schedule" -> seconds, every grouped family
                heuristic = None
                for fam in GROUPED_FAMILIES:
                    if not fam.supports(dev)[0]:
                        continue
                    own, cands = stage_configs(fam, problem, sms, families, current)
                    # The family's heuristic schedule is its reference; where it passes (another family's
                    # side of the token range), its first candidate.
                    base = own or (cands[0] if cands else None)
                    if base is None or not cands:
                        continue
                    if own is not None and heuristic is None:  # what selection without a profile would run
                        heuristic = f"{fam.name}:{own.schedule}"
                    fam.launcher(base, dev)(src, w, ids, wts, out, t, shape.top_k, stream)
                    ref = out.clone()  # (h stays this reference's: the down stage reads it)
                    for config in cands:
                        sched = config.schedule
                        launch = fam.launcher(config, dev)
                        probe = torch.full_like(out, float("nan"))
                        launch(src, w, ids, wts, probe, t, shape.top_k, stream)
                        if not _agrees(probe, ref, w.k):
                            log(f"  {name} T={t} {stage} {fam.name}:{sched}: output differs from {base.schedule}; "
                                "skipped")
                            continue
                        # The stream at call time: under capture, the capturing stream (a launch on
                        # another stream would not be in the graph).
                        times[f"{fam.name}:{sched}"] = time_graph(
                            lambda i: launch(src, w, ids, wts, probe, t, shape.top_k, current_stream(dev)), 8, replays)
                    out.copy_(ref)
                if not times:
                    continue
                ranked = sorted(times, key=times.get)
                best = ranked[0]
                stage_times[stage], heuristics[stage] = times, heuristic
                runners = ", ".join(f"{s} {times[s] * 1e6:.1f}" for s in ranked[1:RUNNERS_UP + 1])
                log(f"{name} T={t} {stage}: {best} {times[best] * 1e6:.1f} µs (heuristic {heuristic} "
                    f"{times.get(heuristic, float('nan')) * 1e6:.1f} µs; {len(times)} timed)"
                    + (f"; next: {runners}" if runners else ""))
                stage_best[stage] = (len(winners), times[best])
                winners.append(dict(dtype=problem.dtype, bits=bits, zero_mode=problem.zero_mode, group_size=128,
                                    experts=shape.experts, top_k=shape.top_k, n=w.n, k=w.k, stage=stage,
                                    tokens=bucket, schedule=best, us=round(times[best] * 1e6, 3)))
            if len(stage_best) == 2:  # h and y hold the stage references now
                routings = [(ids, weights)] + [_routing(t, shape, torch.Generator().manual_seed(1000 * i + t))
                                               for i in range(1, LAYER_ROUTINGS)]
                _layer_check(winners, stage_best, stage_times, heuristics, x, w13, w2, routings, y, shape.top_k,
                             replays, f"{name} T={t}", log, incumbent=current_pair(current, problems))
                _one_launch(winners, stage_best, (problems["w13"], problems["w2"]), x, w13, w2, ids, weights, h, y,
                            t, shape.top_k, dev, sms, replays, f"{name} T={t}", log)
        del w13, w2
        torch.cuda.empty_cache()
    return winners


def current_pair(current: Optional[Profile], problems: Dict[str, MoeProblem]) -> Optional[tuple]:
    """The (gate|up, down) schedules ``current`` runs for ``problems`` (stage -> problem) now, or None
    without a profile or where either stage has no entry."""
    hits = [current.lookup_grouped(problems[stage]) if current is not None else None for stage in ("w13", "w2")]
    return tuple(hit[1] for hit in hits) if all(hits) else None


def layer_agrees(y: torch.Tensor, ref: torch.Tensor) -> bool:
    """A layer against another plan's output: h is rounded to the activation dtype between the two
    projections, and another plan adds in its own order (moe_sm90a rounds gate and up to fp16 first),
    so within a few roundings of the layer's scale rather than element-wise as one stage's
    reorderings are. (bench/moe_modes.py checks its plans with it too.)"""
    ref = ref.float()
    return bool(torch.isfinite(y).all()) and float((y.float() - ref).abs().max()) <= 2e-2 * float(ref.abs().max()) + 1e-4


def layer_pairs(stage_times: Dict[str, Dict[str, float]], heuristics: Dict[str, str]) -> List[tuple]:
    """The (gate|up, down) pairs worth timing as the layer: the stage winners first, then the
    heuristics' pair, then the LAYER_TOP fastest of each stage crossed; each once."""
    ranked = {stage: sorted(times, key=times.get)[:LAYER_TOP] for stage, times in stage_times.items()}
    pairs = [(ranked["w13"][0], ranked["w2"][0])]
    if heuristics.get("w13") in stage_times["w13"] and heuristics.get("w2") in stage_times["w2"]:
        pairs.append((heuristics["w13"], heuristics["w2"]))
    pairs += [(a, b) for a in ranked["w13"] for b in ranked["w2"]]
    return list(dict.fromkeys(pairs))


def choose_pair(timed: Dict[tuple, float], staged: tuple, routings: int, margin: float = LAYER_MARGIN):
    """``(best pair, totals)`` from ``timed`` = {(pair, routing): seconds}: each pair's total over the
    routings (pairs not timed under all of them are dropped); the stage winners ``staged`` stay unless
    another pair's total is below theirs by ``margin``."""
    totals: Dict[tuple, float] = {}
    for pair in dict.fromkeys(p for p, _ in timed):
        secs = [timed.get((pair, r)) for r in range(routings)]
        if all(v is not None for v in secs):
            totals[pair] = sum(secs)
    if staged not in totals:
        return staged, totals
    best = min(totals, key=totals.get)
    return (best if totals[best] < (1 - margin) * totals[staged] else staged), totals


def _layer_check(winners, stage_best, stage_times, heuristics, x, w13, w2, routings, y, top_k: int,
                 replays: int, what: str, log, incumbent: Optional[tuple] = None) -> None:
    """Time :func:`layer_pairs` as the layer (cold L2, graphs) under each of ``routings`` (``(ids,
    weights)``; the first is the sweep's, whose output ``y`` is the staged reference every pair is
    checked against); :func:`choose_pair` picks from a runoff of the two best pairs and the one to
    beat, timed again alone with RUNOFF_REPLAYS times the replays, and both entries take its pair
    (each with its stage time, or half the pair's layer time where a stage was not timed).
    ``incumbent``: the pair the swept-against profile runs now (``--against-profile``); it is timed
    too, and it is the pair another must beat by the margin (a stage timed alone can rank a split
    above the incumbent's that the layer on a cold L2 runs slower)."""
    fns = {}
    ids, weights = routings[0]
    pairs = layer_pairs(stage_times, heuristics)
    if incumbent is not None and incumbent not in pairs:
        pairs.append(incumbent)
    for pair in pairs:
        try:
            with forced_schedules(*pair):
                plan = grouped_plan(x, w13, w2, top_k)
            if isinstance(plan, str):
                continue
            configs = plan.configs
            probe = moe_grouped(x, w13, w2, weights, ids, configs=configs)
        except ValueError as exc:  # a pair the families' plan rules refuse
            log(f"  {what} layer {pair[0]} + {pair[1]}: cannot run: {exc}")
            continue
        if not layer_agrees(probe, y):
            log(f"  {what} layer {pair[0]} + {pair[1]}: output differs from the staged reference; skipped")
            continue
        for r, (ids_r, weights_r) in enumerate(routings):
            fns[(pair, r)] = (lambda c, i, w: lambda: moe_grouped(x, w13, w2, w, i, configs=c))(configs, ids_r, weights_r)
    staged = tuple(min(stage_times[stage], key=stage_times[stage].get) for stage in ("w13", "w2"))
    if (staged, 0) not in fns or len(fns) < 2 * len(routings):  # nothing to compare with the stage winners
        return
    timed = {key: secs for key, (secs, _) in time_cold(fns, replays, eager=False).items()}
    pairs_timed = len({pair for pair, _ in timed})
    reference = staged
    if incumbent is not None and all((incumbent, r) in timed for r in range(len(routings))):
        reference = incumbent
    best, totals = choose_pair(timed, reference, len(routings))
    if reference not in totals:
        return
    finalists = list(dict.fromkeys([reference, *sorted(totals, key=totals.get)[:RUNOFF_PAIRS]]))
    if len(finalists) > 1:
        again = {key: fn for key, fn in fns.items() if key[0] in finalists}
        first = {pair: totals[pair] for pair in finalists}
        timed = {key: secs for key, (secs, _) in time_cold(again, replays * RUNOFF_REPLAYS, eager=False).items()}
        best, totals = choose_pair(timed, reference, len(routings))
        again_us = {pair: f"{secs * 1e6:.1f}" for pair, secs in totals.items()}
        log(f"  {what} layer runoff: " + "; ".join(
            f"{a} + {b} {first[(a, b)] * 1e6:.1f} -> {again_us.get((a, b), '-')} µs" for a, b in finalists))
        if reference not in totals:
            return

    def per(pair):
        return " / ".join(f"{timed[(pair, r)] * 1e6:.1f}" for r in range(len(routings)))
    fastest = min(totals, key=totals.get)
    held = f", current {per(incumbent)} µs" if reference == incumbent and incumbent != staged else ""
    log(f"{what} layer: {fastest[0]} + {fastest[1]} {per(fastest)} µs ({len(routings)} routings), stage winners "
        f"{per(staged) if staged in totals else '-'} µs{held} ({pairs_timed} pairs, cold L2; the runoff's times)"
        f"{'' if best == staged else '; current kept' if best == incumbent else '; taken'}")
    if best != staged:
        for stage, schedule in zip(("w13", "w2"), best):
            index = stage_best[stage][0]
            secs = stage_times[stage].get(schedule, timed[(best, 0)] / 2)
            winners[index].update(schedule=schedule, us=round(secs * 1e6, 3))


def _one_launch(winners, stage_best, problems, x, w13, w2, ids, weights, h, y, t: int, top_k: int, dev: int,
                sms: int, replays: int, what: str, log) -> None:
    """Times every family's one-launch pairs (``layer_candidates``) as the layer; where the fastest
    beats the two stage winners added, both winners' entries take its pair (module docstring)."""
    staged = sum(secs for _, secs in stage_best.values())
    times: Dict[tuple, float] = {}
    for fam in GROUPED_FAMILIES:
        if not fam.supports(dev)[0]:
            continue
        for s13, s2 in fam.layer_candidates(problems, sms):
            cfgs = tuple(fam.from_schedule(sc, **p.kind) for sc, p in zip((s13, s2), problems))
            if not all(fam.can_implement(c, p)[0] for c, p in zip(cfgs, problems)) or not fam.plan_rules(cfgs)[0]:
                continue
            up, down = fam.launcher(cfgs[0], dev), fam.launcher(cfgs[1], dev)
            scratch, probe = torch.empty_like(h), torch.full_like(y, float("nan"))
            up.launch_layer(down, x, w13, w2, ids, weights, scratch, probe, t, top_k, current_stream(dev))
            if not _agrees(probe, y, problems[1].k):
                log(f"  {what} one launch {fam.name}:{s13}+{s2}: output differs from the staged reference; skipped")
                continue
            times[(f"{fam.name}:{s13}", f"{fam.name}:{s2}")] = time_graph(
                lambda i: up.launch_layer(down, x, w13, w2, ids, weights, scratch, probe, t, top_k,
                                          current_stream(dev)), 8, replays)
    if not times:
        return
    best = min(times, key=times.get)
    log(f"{what} one launch: {best[0]} + {best[1]} {times[best] * 1e6:.1f} µs against the staged winners' "
        f"{staged * 1e6:.1f} µs ({len(times)} timed)")
    if times[best] < staged:
        for (index, _), schedule in zip((stage_best["w13"], stage_best["w2"]), best):
            winners[index].update(schedule=schedule, us=round(times[best] / 2 * 1e6, 3))


def run(models: Sequence[str], tokens: Sequence[int], dtype: torch.dtype, out=None, replays: int = 7,
        families: Optional[Sequence[str]] = None, against_profile: bool = False, bits: int = 4,
        jobs: Optional[int] = None) -> Path:
    """Sweep and merge the winners into the profile at ``out`` (default: the GPU's in the cache).
    ``families`` keeps only those grouped families' candidates; ``against_profile`` also times, for each
    stage, the schedule of the merged-into profile's entry (what selection with it runs now)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    path = Path(out) if out else default_profile_path(props.name)
    profile = Profile.load(path, with_base=False) if path.exists() else Profile(
        {"name": props.name, "compute_capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count},
        {"driver": _versions.driver(), "nvcc": _versions.nvcc(), "cutlass": _versions.cutlass(),
         "torch": _versions.torch_version(), "mixed_gemm": __version__})
    # What selection runs now reads the profile with its base underneath (an H200 profile over the
    # H100's); the winners still merge into the file's own entries only.
    current = Profile.load(path) if against_profile and path.exists() else None
    for e in sweep(models, tokens, dtype, replays, families=families, current=current, bits=bits, jobs=jobs):
        profile.add_grouped(e)
    profile.save(path)
    clear_cache()  # this process's next plan reads the new entries
    return path
