"""The measurements of ``mixed-gemm bench``: per shape and M, mg.matmul as selected and torch fp16
(cuBLAS), and with ``compare`` the peer libraries of :mod:`.peers` (tinygemm, gemlite,
humming-kernels, each where installed), all on a cold L2 in CUDA graphs."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch

from ..ops import explain, matmul
from ..profiler.timing import calls_for, copies_for, host_overhead, time_graph
from ..profiler.workload import TORCH_DTYPES, packed_bytes, random_weights
from . import peers as peer_libs
from .limits import floor_s, limit_s


@dataclass(frozen=True)
class WeightKind:
    dtype: str = "f16"
    bits: int = 4
    group_size: int = 128
    zero_mode: str = "int"


def _timed(fn, copies: int) -> float:
    return time_graph(fn, calls_for(fn, copies))


def weight_bytes(n: int, k: int, kind: WeightKind) -> int:
    """What the weight streams: its packed codes, scales and (unless symmetric) zero points."""
    return packed_bytes(n, k, kind.bits, kind.group_size, kind.zero_mode != "sym")


def row_of(label: str, n: int, k: int, m: int, kind: WeightKind, t_mg: float, t_fp: float, schedule: str,
           bandwidth: float) -> Dict:
    """One table row from the two times (seconds): speedup over fp16; ``limit``, the best speedup
    the shape allows (:func:`.limits.limit_s`), and ``of_limit``, the share of it reached;
    ``floor_share``, the weight's bytes at the peak bandwidth over mg's time; ``copy_share``, every
    byte mg moves (weight, x, y) at this run's measured copy ``bandwidth`` over mg's time."""
    qbytes = weight_bytes(n, k, kind)
    speedup, limit = t_fp / t_mg, t_fp / limit_s(qbytes, m, n, k)
    return dict(label=label, n=n, k=k, m=m, schedule=schedule, us=t_mg * 1e6, fp16_us=t_fp * 1e6,
                speedup=speedup, limit=limit, of_limit=speedup / limit, floor_share=floor_s(qbytes) / t_mg,
                copy_share=(qbytes + 2 * m * (k + n)) / bandwidth / t_mg, tflops=2 * m * n * k / t_mg / 1e12)


def bench_problem(label: str, n: int, k: int, ms: Sequence[int], kind: WeightKind, bandwidth: float,
                  compare: bool = False, repeat: int = 1) -> List[Dict]:
    """The rows of one shape, one per M. ``repeat`` > 1: mg.matmul and torch are timed that many
    times each, alternately (mg, torch, mg, torch, ...), and each side's median makes the row (the
    single times in ``us_runs`` and ``fp16_us_runs``): a drift of the host or the clocks during the
    run then falls on both sides alike. The peers are timed once."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    td = TORCH_DTYPES[kind.dtype]
    qbytes = weight_bytes(n, k, kind)
    ws = random_weights(n, k, bits=kind.bits, group_size=kind.group_size, zero_mode=kind.zero_mode,
                        dtype=kind.dtype, copies=copies_for(qbytes, l2))
    dense = [(torch.randn(n, k, device="cuda") * 0.02).to(td) for _ in range(copies_for(2 * n * k, l2))]
    ready, notes = peer_libs.prepare(peer_libs.PEERS if compare else (), kind,
                                     lambda peer: (n, k, kind, td, copies_for(qbytes, l2), ws))
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(td)
        y = torch.empty(m, n, device="cuda", dtype=td)
        mg_runs, fp_runs, reference = [], [], None
        for _ in range(repeat):
            mg_runs.append(_timed(lambda i: matmul(x, ws[i % len(ws)], out=y), len(ws)))
            if reference is None and ready:
                reference = y.clone()  # the last replay's product of ws[-1]: the same weight
            fp_runs.append(_timed(lambda i: torch.mm(x, dense[i % len(dense)].t(), out=y), len(dense)))
        t_mg, t_fp = statistics.median(mg_runs), statistics.median(fp_runs)
        row = row_of(label, n, k, m, kind, t_mg, t_fp, explain(m, ws[0]).schedule, bandwidth)
        if repeat > 1:
            row.update(us_runs=[t * 1e6 for t in mg_runs], fp16_us_runs=[t * 1e6 for t in fp_runs])
        peer_libs.time_into(row, ready, notes, x, t_fp, _timed, reference)
        rows.append(row)
    del ws, dense, ready
    torch.cuda.empty_cache()
    return rows


def _calls(kind: WeightKind, n: int, k: int) -> Dict[str, object]:
    """Tiny M=1 problems: mg.matmul both ways, and torch's F.linear / add for scale."""
    td = TORCH_DTYPES[kind.dtype]
    w = random_weights(n, k, bits=kind.bits, group_size=min(kind.group_size, k), zero_mode=kind.zero_mode,
                       dtype=kind.dtype)[0]
    x = torch.randn(1, k, device="cuda").to(td)
    y = torch.empty(1, n, device="cuda", dtype=td)
    dense = torch.randn(n, k, device="cuda").to(td)
    return {"mg.matmul(out=)": lambda: matmul(x, w, out=y), "mg.matmul": lambda: matmul(x, w),
            "F.linear": lambda: torch.nn.functional.linear(x, dense), "torch.add": lambda: torch.add(x, x)}


def eager_overhead(kind: WeightKind, n: int = 256, k: int = 256) -> Dict[str, float]:
    """Host seconds per eager call on a tiny problem, with torch's own calls for scale."""
    return {name: host_overhead(fn) for name, fn in _calls(kind, n, k).items()}


def host_cost(kind: WeightKind, n: int = 4096, k: int = 4096, calls: int = 2000, repeats: int = 5) -> Dict[str, Dict]:
    """Host cost per call measured two ways, median of ``repeats``: ``loop`` = wall time per call of
    ``calls`` back-to-back eager calls (the kernels take less time than their launches, so the GPU
    keeps up and the host is what is timed), and ``eager_minus_graph`` = that minus the per-call
    time of the same calls replayed from one CUDA graph (what the GPU itself needs)."""
    import statistics
    import time

    out = {}
    for name, fn in _calls(kind, n, k).items():
        for _ in range(50):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        loops, graphs = [], []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            loops.append((time.perf_counter() - t0) / calls)
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            graphs.append((time.perf_counter() - t0) / calls)
        loop, replay = statistics.median(loops), statistics.median(graphs)
        out[name] = {"loop_us": loop * 1e6, "graph_us": replay * 1e6, "eager_minus_graph_us": (loop - replay) * 1e6}
        del graph
    return out
