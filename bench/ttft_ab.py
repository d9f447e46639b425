"""Time to first token of one int4 model with one of its fusions on and off, in one process: an
eager prefill is bound by its host thread and varies between processes (int4 62-134 ms on the same
code, docs/notes/end-to-end.md), so only a same-process A/B compares. The two states alternate
(swapped modules put back and forth), medians of ``--reps`` each; host ms is the wall time of the
``generate`` call, GPU ms the CUDA events around it (the same call).

    MIXED_GEMM_JIT=block python bench/ttft_ab.py --swap norms [--model qwen3-30b-a3b --layers 48 --reps 15]

``--swap``: ``norms`` (transformers' RMSNorms / OneKernelRMSNorm), ``routers`` (transformers' routers /
TopKRouter), ``experts`` (the configs' experts implementation as transformers sets it / ``"eager"``,
:func:`~mixed_gemm.integrations.transformers.no_experts_switch`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

from mixed_gemm.integrations import e2e  # noqa: E402
from mixed_gemm.integrations.norms import swappable  # noqa: E402
from mixed_gemm.integrations.router import fused_router  # noqa: E402
from mixed_gemm.nn import OneKernelRMSNorm  # noqa: E402


def _module_swaps(model, kind):
    """(parent, attribute, transformers' module, ours) for every module the fusion replaces."""
    swaps = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if kind == "norms" and swappable(child):
                swaps.append((parent, name, child, OneKernelRMSNorm(child.weight, child.variance_epsilon)))
            elif kind == "routers" and name == "gate":
                ours = fused_router(child)
                if ours is not None:
                    swaps.append((parent, name, child, ours))
    return swaps


def states(model, kind):
    """{"off": set_off, "on": set_on} for the fusion ``kind`` on ``model`` (built with it off)."""
    if kind == "experts":  # built with no_experts_switch applied: "eager" where transformers had "grouped_mm"
        after = dict(model.get_experts_implementation())
        before = {k: "grouped_mm" if v == "eager" else v for k, v in after.items()}
        return {"off": lambda: model.set_experts_implementation(dict(before)),
                "on": lambda: model.set_experts_implementation(dict(after))}, f"{before} -> {after}"
    swaps = _module_swaps(model, kind)

    def put(index):
        for s in swaps:
            setattr(s[0], s[1], s[2 + index])
    return {"off": lambda: put(0), "on": lambda: put(1)}, f"{len(swaps)} modules"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swap", required=True, help="comma-separated, of norms, routers, experts: each A/B in turn "
                                                  "on one model, left on for the next")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    kinds = args.swap.split(",")
    if not kinds or not set(kinds) <= {"norms", "routers", "experts"}:
        ap.error(f"--swap: expected a comma-separated list of norms, routers, experts, got {args.swap!r}")
    model = e2e.build_fp16(args.model, args.layers)
    e2e.quantize_in_place(model, lm_head="int4", routers="routers" not in kinds, norms="norms" not in kinds)

    def once():
        start = time.perf_counter()
        gpu = e2e.ttft_ms(model)
        return gpu, (time.perf_counter() - start) * 1e3

    print(f"# {args.model} ({args.layers} layers) int4, {e2e.TTFT_PROMPT}-token prompt; "
          f"{torch.cuda.get_device_name()}; median of {args.reps}, alternating\n")
    print("| swap | state | TTFT ms (CUDA events) | host ms (wall) | on/off |\n|---|---|---|---|---|")
    for kind in kinds:
        setters, what = states(model, kind)
        times = {"off": [], "on": []}
        with torch.no_grad():
            for state in ("off", "on", "off", "on"):  # cold calls: kernels load, caches warm
                setters[state]()
                once()
            for rep in range(args.reps):
                for state in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                    setters[state]()
                    times[state].append(once())
        setters["on"]()
        med = {s: [statistics.median(t[i] for t in times[s]) for i in (0, 1)] for s in times}
        for s in ("off", "on"):
            ratio = f"{med['on'][0] / med['off'][0]:.3f}x" if s == "on" else ""
            print(f"| {kind} ({what}) | {s} | {med[s][0]:.1f} | {med[s][1]:.1f} | {ratio} |", flush=True)
        print("  samples (ms): " + "; ".join(f"{s}: " + " ".join(f"{g:.0f}" for g, _ in times[s]) for s in times),
              flush=True)


if __name__ == "__main__":
    main()
