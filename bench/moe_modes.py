"""A/B of moe_gemv's persistent mode against what ``mixed_gemm.moe`` selects today, per MoE preset
and token count: (a) ``mg.moe`` as selected (override -> the GPU's profile -> heuristics), (b) the
persistent plan the heuristics pick (``heuristics.persistent_config`` with its launch fields, also
for Mixtral, whose heuristic keeps pair / expert mode), (c) forced persistent plans: 8 and 16 rows
per pass, each with a few K splits per projection, (d) each persistent plan of (b) and (c) again in
ONE launch (``_pe1``: gate|up and down items from one work queue, ``templates/moe_gemv/moe_fused.cuh``;
labelled ``pe1 ...``). Each row: µs and the share of the int4 floor
(the touched experts' codes, scales and zeros once at 3.0 TB/s: ``benchmark.moe.int4_floor_s``).
Every plan is timed the same way (``profiler.timing.time_cold`` with ``eager=False``: cold L2, each plan
called once eagerly, then captured in a CUDA graph and timed from its replay only, every plan
alternating, median), so host time counts for none of them; a plan that cannot be captured is timed
eagerly, marked (e), with the reason printed beside it. Each forced plan runs first through
``mg.moe`` inside ``forced_schedules`` (the MIXED_GEMM_MOE_SCHEDULE path: builds its kernels, sizes
the workspaces), and its output is checked against (a)'s ("!" marks a mismatch); it is then timed
as ``moe_grouped(configs=...)`` of the same configs (a cached plan: the same two launches). On
random int4 g128 experts and random softmax top-k routing. Prints a line per plan, then a summary
table (the best two-launch and the best one-launch persistent plan per model and token count).

    MIXED_GEMM_JIT=block python bench/moe_modes.py            # qwen3, deepseek, mixtral at 1,16,64,256
    MIXED_GEMM_JIT=block python bench/moe_modes.py --models qwen3-30b-a3b --tokens 16 --json out.json
    MIXED_GEMM_JIT=block python bench/moe_modes.py --pdl --pdl-only --models qwen3-30b-a3b --tokens 1,3,16

``--pdl``: every two-launch plan of ``selected`` and ``pe heuristic`` is timed again with the down
kernel launched as a programmatic dependent (``ops.moe_grouped.pdl_launches``: starts while gate|up
finishes, waits for h; with ``--pdl-prefetch`` it also prefetches its weights into L2 before the
wait; rows labelled ``... pdl``), and the plain rows with it forced off, so ``$MIXED_GEMM_MOE_PDL``
changes neither; the same graphs' replays alternate in one run. ``--pdl-only`` skips the forced
persistent plans (just those four rows).

``--down S1,S2,...``: instead of the persistent plans, the selected plan with its down projection
swapped for each schedule given (rows ``down <schedule>``; the gate|up launch is the selected
one's): the A/B of one projection's candidates inside the whole layer. A bare schedule is
moe_gemv's; ``family:schedule`` names any grouped family's (``moe_sm90s:w2_t192x128x128_s0_p``).
``--up`` likewise swaps the gate|up projection (rows ``up <schedule>``), and ``--pair U+D,...``
both at once (rows ``pair <U>+<D>``).

    python bench/moe_modes.py --models qwen3-30b-a3b --tokens 1,2 --down w2_s1_w1x16_u16_ds_sw,w2_s1_w1x8_u16_ds_sw
    python bench/moe_modes.py --tokens 4096 --pair moe_sm90s:w13_t192x128x128_s0_p+moe_sm90s:w2_t192x128x128_s0_p

Kernels are JIT-built with ``MIXED_GEMM_JIT=block`` (the default here: an async build would time
the per-expert stand-in): 6 persistent kernels per dtype (w13 / w2 / one launch x 8 / 16 rows) plus
those the profile selects (moe_gemv and moe_sm90a). 36-48 plans per case, 7 rounds: at the default
arguments expect 6-8 minutes on an H100, builds included (``--tokens 1,16`` or fewer ``--models``
halve it). To force the plan of ``mg.moe``
itself elsewhere (``mixed-gemm bench --moe``, an end-to-end run): ``MIXED_GEMM_MOE_SCHEDULE=
moe_gemv:<w13 schedule>,moe_gemv:<w2 schedule>`` (mixed_gemm/ops/moe_grouped.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

from mixed_gemm.benchmark.moe import MOE_MODELS, int4_floor_s, packed_expert_bytes, touched_experts  # noqa: E402
from mixed_gemm.kernels import family  # noqa: E402
from mixed_gemm.kernels.base import sm_count  # noqa: E402
from mixed_gemm.kernels.moe_gemv import FAMILY, MoeGemvConfig  # noqa: E402
from mixed_gemm.kernels.moe_gemv.catalog import persistent_shapes_for  # noqa: E402
from mixed_gemm.kernels.moe_gemv.heuristics import launch_fields, persistent_config  # noqa: E402
from mixed_gemm.ops import moe, prepack_experts  # noqa: E402
from mixed_gemm.ops.moe_grouped import (GroupedPlan, _problems, forced_schedules, grouped_plan,  # noqa: E402
                                        moe_grouped, pdl_launches)
from mixed_gemm.profiler.moe_sweep import layer_agrees  # noqa: E402
from mixed_gemm.profiler.timing import time_cold  # noqa: E402
from mixed_gemm.profiler.workload import random_routing  # noqa: E402
from mixed_gemm.select import m_bucket  # noqa: E402

DEFAULT_MODELS = ("qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b")
SPLITS = (1, 2, 4)  # forced K splits per projection, beside the heuristic's


def packed_layer(name: str, dtype: torch.dtype, group: int = 128):
    """Random int4 g``group`` experts of preset ``name`` (integer zeros), drawn on the GPU (seeded)."""
    shape = MOE_MODELS[name]
    gen = torch.Generator(device="cuda").manual_seed(7)
    stacks = []
    for n, k, gate_up in ((2 * shape.inter, shape.hidden, True), (shape.hidden, shape.inter, False)):
        q = torch.randint(0, 16, (shape.experts, n, k), generator=gen, dtype=torch.uint8, device="cuda")
        s = ((torch.rand(shape.experts, n, k // group, generator=gen, device="cuda") + 0.5) * (2 / (16 * k**0.5)))
        z = torch.randint(0, 16, (shape.experts, n, k // group), generator=gen, device="cuda")
        stacks.append(prepack_experts(q, s.to(dtype), z.to(dtype), bits=4, group_size=group, dtype=dtype,
                                      layout="sm90a", gate_up=gate_up))
        del q, s, z
    return shape, stacks[0], stacks[1]


def schedules(configs) -> str:
    return " + ".join(f"{c.family}:{c.schedule}" for c in configs)


def persistent_plans(problems, sms: int):
    """``{label: (w13 config, w2 config)}``: the heuristic's persistent plan, then forced ones (8 / 16
    rows per pass x K splits per projection, each split as the launch geometry makes it)."""
    plans = {"pe heuristic": tuple(launch_fields(persistent_config(p), p, sms) for p in problems)}
    for rows in (8, 16):
        per_stage = []
        for p, heur in zip(problems, plans["pe heuristic"]):
            stage, strips, warps, unroll, tokens = persistent_shapes_for(p.bits, p.stage, rows)[0]
            base = MoeGemvConfig(stage=stage, strips=strips, warps=warps, unroll=unroll, tokens=tokens,
                                 persistent=True, **p.kind)
            seen, configs = set(), []
            for s in sorted(set(SPLITS) | {heur.splits}):
                c = base.replace(splits=min(s, base.steps(p.k)))
                c = c.replace(splits=c.launch_geometry(p.n, p.k)[1])  # the slices that actually run
                if c.splits not in seen and FAMILY.can_implement(c, p)[0]:
                    seen.add(c.splits)
                    configs.append(c)
            per_stage.append(configs)
        for c13 in per_stage[0]:
            for c2 in per_stage[1]:
                plans.setdefault(f"pe m{rows} s{c13.splits}/{c2.splits}", (c13, c2))
    for label, cfgs in list(plans.items()):  # the same plan in one launch (both configs _pe1: one kernel)
        plans.setdefault("pe1" + label[2:], tuple(c.replace(fused=True) for c in cfgs))
    unique, seen = {}, set()
    for label, cfgs in plans.items():  # the heuristic's plan is also one of the forced ones: time it once
        if cfgs not in seen:
            seen.add(cfgs)
            unique[label] = cfgs
    return unique


def with_pdl(fn, enabled: bool, prefetch: bool = False):
    """``fn`` with the down launch's PDL forced on (with the L2 ``prefetch`` before its wait) or off
    (decided at capture: the graph keeps it)."""
    def call():
        with pdl_launches(enabled, prefetch=prefetch):
            return fn()
    return call


def parse_config(schedule: str, kind: dict):
    """``family:schedule`` (any grouped family's) or a bare moe_gemv schedule, as a config of ``kind``."""
    name, _, sched = schedule.rpartition(":")
    return family(name or "moe_gemv").config_class.from_schedule(sched, **kind)


def swapped_plans(plan, down, up, kind, pairs=()) -> dict:
    """``{"down <schedule>": (selected gate|up, that down)}`` for ``--down``, ``{"up <schedule>":
    (that gate|up, selected down)}`` for ``--up``, ``{"pair <U>+<D>": (U, D)}`` for ``--pair``."""
    if not isinstance(plan, GroupedPlan):
        return {}
    plans = {f"down {s}": (plan.configs[0], parse_config(s, kind)) for s in down}
    plans.update({f"up {s}": (parse_config(s, kind), plan.configs[1]) for s in up})
    plans.update({f"pair {s}": tuple(parse_config(p, kind) for p in s.split("+")) for s in pairs})
    return plans


def run_case(name, shape, w13, w2, dtype, t: int, sms: int, reps: int, log=print, pdl=False, pdl_only=False,
             pdl_prefetch=False, down=(), up=(), pairs=()):
    gen = torch.Generator().manual_seed(1000 + t)
    x = (torch.randn(t, shape.hidden, generator=gen) / 4).to("cuda", dtype)
    weights, ids = random_routing(t, shape, gen)
    touched = touched_experts(ids)
    floor = int4_floor_s(touched, packed_expert_bytes(w13, w2))
    plan = grouped_plan(x, w13, w2, shape.top_k)
    selected = f"{schedules(plan.configs)} ({plan.source})" if isinstance(plan, GroupedPlan) else f"per-expert: {plan}"
    problems = _problems(m_bucket(t), shape.top_k, w13, w2)
    swaps = down or up or pairs
    plans = swapped_plans(plan, down, up, problems[1].kind, pairs) if swaps else persistent_plans(problems, sms)
    if pdl_only:
        plans = {k: v for k, v in plans.items() if k == "pe heuristic"}
    ref = moe(x, w13, w2, weights, ids)
    fns, labels, bad = {"selected": lambda: moe(x, w13, w2, weights, ids)}, {"selected": selected}, set()
    for label, cfgs in plans.items():
        # Through mg.moe with the plan forced (the MIXED_GEMM_MOE_SCHEDULE path): builds the kernels
        # (blocking), loads the launchers, sizes the workspaces, and checks the output.
        try:
            with forced_schedules(*(f"{c.family}:{c.schedule}" for c in cfgs)):
                y = moe(x, w13, w2, weights, ids)
                forced = grouped_plan(x, w13, w2, shape.top_k)
        except ValueError as exc:  # a plan these experts' rules refuse: said, not timed
            log(f"  {label}: {schedules(cfgs)} cannot run: {exc}")
            continue
        cfgs = forced.configs
        if not layer_agrees(y, ref):
            bad.add(label)
        # Timed as the same launches with the configs pinned (moe_grouped caches their plan, so a
        # call is the same host path as mg.moe's: a dict lookup, two launches; capturable).
        fns[label] = (lambda c: lambda: moe_grouped(x, w13, w2, weights, ids, configs=c))(cfgs)
        if not torch.equal(fns[label](), y):
            bad.add(label)
        labels[label] = schedules(cfgs)
    if pdl:  # the A/B: each plan with PDL forced off and on (one-launch plans have no second launch)
        for label in [k for k in ("selected", "pe heuristic") if k in fns and "_pe1" not in labels[k]]:
            fns[f"{label} pdl"], labels[f"{label} pdl"] = with_pdl(fns[label], True, pdl_prefetch), labels[label]
            fns[label] = with_pdl(fns[label], False)
            if label in bad:
                bad.add(f"{label} pdl")
            if not torch.equal(fns[f"{label} pdl"](), fns[label]()):  # the same kernels and sums
                bad.add(f"{label} pdl")
    uncaptured = {}
    timed = time_cold(fns, reps, eager=False, uncaptured=uncaptured)  # every capturable plan: its graph only
    log(f"{name} T={t}: {touched} touched experts, int4 floor {floor * 1e6:.1f} µs")
    rows = []
    for label, (secs, how) in timed.items():
        row = dict(model=name, tokens=t, plan=label, schedules=labels[label], us=secs * 1e6, how=how,
                   floor_us=floor * 1e6, of_floor=floor / secs if secs else 0.0, agrees=label not in bad)
        if label in uncaptured:
            row["uncaptured"] = uncaptured[label]
        rows.append(row)
        log(f"  {label:<16} {row['us']:8.1f} µs ({how[0]}) {100 * row['of_floor']:4.0f}% of floor"
            f"{'  !' if label in bad else ''}  {labels[label]}"
            + (f"  [not captured: {uncaptured[label]}]" if label in uncaptured else ""))
    return rows


def summary(rows):
    out = ["| model | tokens | int4 floor µs | selected µs (% floor) | pe heuristic µs (%) | best persistent µs (%) "
           "| best persistent plan | pe1 heuristic µs (%) | best one-launch µs (%) | best one-launch plan |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["model"], r["tokens"]) for r in rows):
        case = {r["plan"]: r for r in rows if (r["model"], r["tokens"]) == key}
        ok = [r for r in case.values() if not r["plan"].startswith(("selected", "down ", "up ", "pair "))
              and not r["plan"].endswith(" pdl") and r["agrees"]]
        pe = [r for r in ok if not r["plan"].startswith("pe1")]
        pe1 = [r for r in ok if r["plan"].startswith("pe1")]
        best = min(pe, key=lambda r: r["us"]) if pe else None
        best1 = min(pe1, key=lambda r: r["us"]) if pe1 else None
        cell = lambda r: f"{r['us']:.1f} ({r['how'][0]}, {100 * r['of_floor']:.0f}%)" if r else "-"  # noqa: E731
        sel, heur, heur1 = case.get("selected"), case.get("pe heuristic"), case.get("pe1 heuristic")
        out.append(f"| {key[0]} | {key[1]} | {sel['floor_us']:.1f} | {cell(sel)} | {cell(heur)} | {cell(best)} | "
                   f"{best['schedules'] if best else '-'} | {cell(heur1)} | {cell(best1)} | "
                   f"{best1['schedules'] if best1 else '-'} |")
    downs = [r for r in rows if r["plan"].startswith(("down ", "up ", "pair "))]
    if downs:  # --down / --up / --pair: the selected plan against one or both projections swapped
        out += ["", "| model | tokens | selected µs (% floor) | swapped µs (% floor) | swapped in |",
                "|---|---|---|---|---|"]
        for r in downs:
            sel = next(o for o in rows if (o["model"], o["tokens"], o["plan"]) == (r["model"], r["tokens"], "selected"))
            out.append(f"| {r['model']} | {r['tokens']} | {sel['us']:.1f} ({100 * sel['of_floor']:.0f}%) | "
                       f"{r['us']:.1f} ({100 * r['of_floor']:.0f}%){'' if r['agrees'] else ' !'} | {r['plan']} |")
    pdl = [r for r in rows if r["plan"].endswith(" pdl")]
    if pdl:  # --pdl: each plan without and with the down launch's PDL
        out += ["", "| model | tokens | plan | PDL off µs | PDL on µs | saved µs | schedules |",
                "|---|---|---|---|---|---|---|"]
        for r in pdl:
            off = next(o for o in rows
                       if (o["model"], o["tokens"], o["plan"]) == (r["model"], r["tokens"], r["plan"][:-4]))
            out.append(f"| {r['model']} | {r['tokens']} | {off['plan']} | {off['us']:.1f} | {r['us']:.1f}"
                       f"{'' if r['agrees'] else ' !'} | {off['us'] - r['us']:.1f} | {r['schedules']} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--tokens", default="1,16,64,256")
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--reps", type=int, default=7, help="timing rounds (median)")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--pdl", action="store_true", help="also time selected / pe heuristic with the down launch's PDL")
    ap.add_argument("--pdl-only", action="store_true", help="with --pdl: skip the forced persistent plans")
    ap.add_argument("--pdl-prefetch", action="store_true",
                    help="with --pdl: the down kernel also prefetches its weights into L2 before its wait")
    ap.add_argument("--down", default="", help="comma-separated down schedules (moe_gemv's, or family:schedule) "
                                                "swapped into the selected plan (instead of the persistent plans)")
    ap.add_argument("--up", default="", help="likewise, gate|up schedules")
    ap.add_argument("--pair", default="", help="comma-separated <gate|up>+<down> schedule pairs swapped in together")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_modes: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    sms = sm_count(torch.cuda.current_device())
    start, rows = time.time(), []
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, MIXED_GEMM_JIT={os.environ['MIXED_GEMM_JIT']}", flush=True)
    for name in args.models.split(","):
        shape, w13, w2 = packed_layer(name, dtype)
        for t in (int(v) for v in args.tokens.split(",")):
            rows += run_case(name, shape, w13, w2, dtype, t, sms, args.reps, log=lambda s: print(s, flush=True),
                             pdl=args.pdl, pdl_only=args.pdl_only, pdl_prefetch=args.pdl_prefetch,
                             down=[d for d in args.down.split(",") if d], up=[u for u in args.up.split(",") if u],
                             pairs=[p for p in args.pair.split(",") if p])
        del w13, w2
        torch.cuda.empty_cache()
    print(f"\n({time.time() - start:.0f} s; µs per layer, (g) graph replay / (e) eager, only where a plan could "
          "not be captured (the reason is printed beside it); % of the int4 floor)")
    print("\n".join(summary(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
