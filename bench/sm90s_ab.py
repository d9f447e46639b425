"""A/B of the sm90s family on the 8 Llama-3 8B/70B shapes: cuBLAS fp16, the current selection and
every sm90s catalog kernel of the weight kind, timed alternately (cold L2, CUDA graphs, median of
``--rounds``), each checked against the dequantized weight first.

    python bench/sm90s_ab.py [--ms 16,32,64,128,256] [--rounds 3] [--dtype f16] [--group 128]
                             [--decompositions auto] [--models llama3-8b,llama3-70b] [--only c2x1]
                             [--out FILE]

Every kernel the table needs (the sm90s schedules and what the current selection picks) is built
first, in parallel (``--jobs``, default all cores; sm90s kernels take about 15 s each, sm90a
ones a minute or more), then timed; a run on a fresh machine spends most of its first minutes
there. The current selection is what
``mg.matmul`` picks with no override (``MIXED_GEMM_SM90S`` unset: sm90s is only taken where a
profile names it). Prints one row per (shape, M): the fp16 time, the current selection's time and
speedup, each sm90s schedule's speedup over fp16, and the best sm90s schedule; then the geomean
speedups per M.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
from typing import Dict, List

# Time the kernels selection picks, not a stand-in that runs while they compile.
os.environ.setdefault("MIXED_GEMM_JIT", "block")

import torch  # noqa: E402

import mixed_gemm as mg  # noqa: E402
from mixed_gemm.compile import blocking, build_specs  # noqa: E402
from mixed_gemm.kernels import family, family_of  # noqa: E402
from mixed_gemm.profiler.problems import MODELS, parse_ints  # noqa: E402
from mixed_gemm.profiler.timing import copies_for, time_graph  # noqa: E402
from mixed_gemm.profiler.workload import TORCH_DTYPES, packed_bytes, random_weights  # noqa: E402

MAX_ERR = 1e-2  # max |y - ref| / max |ref|: a wrong kernel is reported, not timed


def geomean(values: List[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def sm90s_configs(dtype: str, bits: int, decompositions: List[str], only: str = ""):
    """The catalog kernels of the weight kind (those whose schedule contains ``only``), each with
    every decomposition asked for."""
    fam = family("sm90s")
    out = []
    for kernel in fam.catalog():
        if kernel.dtype != dtype or kernel.bits != bits or only not in kernel.schedule:
            continue
        for d in decompositions:
            out.append(kernel.replace(decomposition="split", splits=int(d[5:])) if d.startswith("split")
                       else kernel.replace(decomposition=d))
    return out


def short(schedule: str) -> str:
    """t128x64x128_c1x1_o1_s0_auto -> 64x128o1 auto, t128x64x128_c2x1_o1_s0_ph_split2 ->
    64x128o1c2ph split2, t256x64x128_c1x1_o1_s0_hi_auto -> 64x128o1him256 (the column header)."""
    tm, tn, tk = schedule.split("_")[0][1:].split("x")
    parts = schedule.split("_")
    cluster = "" if parts[1] == "c1x1" else parts[1][:2]
    phased = "ph" if "ph" in parts[4:-1] else ""
    half = "hi" if "hi" in parts[4:-1] else ""
    rows = "" if tm == "128" else f"m{tm}"
    return f"{tn}x{tk}{parts[2]}{cluster}{phased}{half}{rows}{'' if parts[-1] == 'auto' else ' ' + parts[-1]}"


def prebuild(shapes, ms: List[int], dtype: str, bits: int, group: int, configs, jobs: int) -> None:
    """Build every kernel the table times, in parallel: the sm90s configs' and the current selection's."""
    kernels = {c.kernel for c in configs}
    for _, n, k in shapes:
        w = random_weights(n, k, bits=bits, group_size=group, dtype=dtype)[0]
        kernels |= {mg.explain(m, w).config.kernel for m in ms}
        del w
    specs = [family_of(c).build_spec(c) for c in kernels]
    print(f"building {len(specs)} kernels ({jobs} jobs) ...", flush=True)
    with blocking():
        build_specs(specs, jobs=jobs)


def bench_shape(label: str, n: int, k: int, ms: List[int], dtype: str, bits: int, group: int, configs,
                rounds: int) -> List[Dict]:
    td = TORCH_DTYPES[dtype]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    qbytes = packed_bytes(n, k, bits, group, True)
    ws = random_weights(n, k, bits=bits, group_size=group, dtype=dtype, copies=copies_for(qbytes, l2))
    dense = [(torch.randn(n, k, device="cuda") * 0.02).to(td) for _ in range(copies_for(2 * n * k, l2))]
    w_ref = mg.dequantize(ws[0]).float()
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(td)
        y = torch.empty(m, n, device="cuda", dtype=td)
        want = x.float() @ w_ref.t()
        scale = want.abs().max().item()
        errs, runnable = {}, {"fp16": lambda i: torch.mm(x, dense[i % len(dense)].t(), out=y),
                              "current": lambda i: mg.matmul(x, ws[i % len(ws)], out=y)}
        for c in configs:
            y.fill_(float("nan"))
            try:
                mg.matmul(x, ws[0], config=c, out=y)
                torch.cuda.synchronize()
                err = ((y.float() - want).abs().max().item() / scale)
            except Exception as exc:  # noqa: BLE001 - report and go on: one broken schedule must not stop the table
                print(f"  {label} m={m} {c.schedule}: {type(exc).__name__}: {exc}", flush=True)
                err = float("inf")
            errs[c.schedule] = err
            if err <= MAX_ERR:
                runnable[c.schedule] = (lambda i, c=c: mg.matmul(x, ws[i % len(ws)], config=c, out=y))
            else:
                print(f"  {label} m={m} {c.schedule}: max error {err:.2e} > {MAX_ERR}: not timed", flush=True)
        times = {name: [] for name in runnable}
        for _ in range(rounds):  # alternate, so drift between rounds hits every kernel alike
            for name, fn in runnable.items():
                copies = len(dense) if name == "fp16" else len(ws)
                times[name].append(time_graph(fn, 2 * copies))
        med = {name: statistics.median(t) for name, t in times.items()}
        fp = med.pop("fp16")
        current = med.pop("current")
        row = dict(label=label, n=n, k=k, m=m, fp16_us=fp * 1e6, current_us=current * 1e6, current=fp / current,
                   current_schedule=mg.explain(m, ws[0]).schedule, sm90s={s: fp / t for s, t in med.items()},
                   errs=errs)
        best = max(row["sm90s"], key=row["sm90s"].get) if row["sm90s"] else None
        row["best"], row["best_speedup"] = best, (row["sm90s"][best] if best else float("nan"))
        rows.append(row)
        print(format_row(row, configs), flush=True)
    del ws, dense, w_ref
    torch.cuda.empty_cache()
    return rows


def header(configs) -> str:
    cols = "".join(f"{short(c.schedule):>14s}" for c in configs)
    return f"{'shape':>18s} {'M':>4s} {'fp16 us':>8s} {'current':>16s}{cols}   best sm90s"


def format_row(row: Dict, configs) -> str:
    cols = "".join(f"{row['sm90s'].get(c.schedule, float('nan')):13.2f}x" for c in configs)
    cur = f"{row['current_us']:6.1f}us {row['current']:5.2f}x"
    best = f"{short(row['best'])} {row['best_speedup']:.2f}x" if row["best"] else "-"
    return f"{row['label']:>18s} {row['m']:4d} {row['fp16_us']:8.1f} {cur:>16s}{cols}   {best}"


def summary(rows: List[Dict], ms: List[int], configs) -> List[str]:
    lines = ["", "geomean speedup over cuBLAS fp16 by M (current selection | best sm90s per shape | each sm90s schedule):"]
    for m in ms:
        at = [r for r in rows if r["m"] == m]
        each = "  ".join(f"{short(c.schedule)} {geomean([r['sm90s'][c.schedule] for r in at if c.schedule in r['sm90s']]):.2f}x"
                         for c in configs)
        lines.append(f"  M={m:4d}: current {geomean([r['current'] for r in at]):.2f}x | best sm90s "
                     f"{geomean([r['best_speedup'] for r in at if r['best']]):.2f}x | {each}")
    lines.append("current selection:")
    for label in dict.fromkeys(r["label"] for r in rows):
        lines.append(f"  {label}: " + ", ".join(f"m={r['m']} {r['current_schedule']}" for r in rows
                                                 if r["label"] == label))
    return lines


def main() -> None:
    summary_text, details = __doc__.split("\n\n", 1)
    ap = argparse.ArgumentParser(description=summary_text, epilog=details,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="16,32,64,128,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    ap.add_argument("--bits", type=int, choices=[4, 8], default=4)
    ap.add_argument("--group", type=int, default=128, help="group size (-1: per channel)")
    ap.add_argument("--decompositions", default="auto", help="comma-separated: auto, dp, split<S>")
    ap.add_argument("--models", default="llama3-8b,llama3-70b")
    ap.add_argument("--only", default="", help="only sm90s schedules containing this text (e.g. c2x1, x128x128)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes for the builds")
    ap.add_argument("--out", default=None, help="also write the table here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sm90s_ab: needs an sm_90 GPU")
    if os.environ.get("MIXED_GEMM_SM90S"):
        print("note: MIXED_GEMM_SM90S is set, so 'current' may itself be sm90s")
    ms = parse_ints(a.ms, "--ms")
    configs = sm90s_configs(a.dtype, a.bits, [d.strip() for d in a.decompositions.split(",") if d.strip()], a.only)
    print(f"{torch.cuda.get_device_name(0)}; {a.dtype} u{a.bits} g{a.group}; {len(configs)} sm90s schedules; "
          f"{a.rounds} rounds")
    shapes = [(f"{model.replace('llama3-', '')} {layer} {n}x{k}", n, k) for model in a.models.split(",")
              for layer, n, k in MODELS[model]]
    prebuild(shapes, ms, a.dtype, a.bits, a.group, configs, a.jobs)
    print(header(configs), flush=True)
    rows = []
    for label, n, k in shapes:
        rows += bench_shape(label, n, k, ms, a.dtype, a.bits, a.group, configs, a.rounds)
    lines = summary(rows, ms, configs)
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write(header(configs) + "\n" + "\n".join(format_row(r, configs) for r in rows) + "\n" + "\n".join(lines)
                    + "\n")


if __name__ == "__main__":
    main()
