"""The measurements of ``mixed-gemm bench``: per shape and M, mg.matmul as selected, torch fp16
(cuBLAS) and optionally PyTorch's tinygemm (int4) and gemlite (its 1/2/4/8-bit A16Wn layers, where
the ``gemlite`` package is installed), all on a cold L2 in CUDA graphs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch

from ..formats.tinygemm import pack_codes
from ..ops import explain, matmul
from ..profiler.timing import calls_for, copies_for, host_overhead, time_graph
from ..profiler.workload import TORCH_DTYPES, packed_bytes, random_weights


@dataclass(frozen=True)
class WeightKind:
    dtype: str = "f16"
    bits: int = 4
    group_size: int = 128
    zero_mode: str = "int"


def _timed(fn, copies: int) -> float:
    return time_graph(fn, calls_for(fn, copies))


def _tinygemm_weights(n: int, k: int, group: int, copies: int):
    """int4 weights in tinygemm's layout (``torch._convert_weight_to_int4pack``) with bf16
    scales-and-zeros; raises when this torch lacks it or rejects the shape."""
    packed = pack_codes(torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda"))
    sz = (torch.rand(k // group, n, 2, device="cuda") * 0.01).to(torch.bfloat16)
    return [(packed, sz) if i == 0 else (packed.clone(), sz.clone()) for i in range(copies)]


GEMLITE_BITS = (1, 2, 4, 8)


def _gemlite_layers(n: int, k: int, bits: int, group: int, dtype: torch.dtype, copies: int):
    """gemlite's grouped-INT weight-only layers (``gemlite.helper.A16Wn``) of random codes; raises
    when gemlite is missing or refuses the kind."""
    from gemlite.helper import A16Wn

    if bits not in GEMLITE_BITS:
        raise ValueError(f"gemlite has no {bits}-bit grouped-INT layer")
    out = []
    for _ in range(copies):
        q = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device="cuda")
        s = (torch.rand(n, k // group, device="cuda") * 0.01).to(dtype)
        z = torch.randint(0, 2**bits, (n, k // group), device="cuda").to(dtype)
        out.append(A16Wn(device="cuda", dtype=dtype).from_weights(q, s, z, bits, group))
    return out


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def bench_problem(label: str, n: int, k: int, ms: Sequence[int], kind: WeightKind, bandwidth: float,
                  compare: bool = False) -> List[Dict]:
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    td = TORCH_DTYPES[kind.dtype]
    qbytes = packed_bytes(n, k, kind.bits, kind.group_size, kind.zero_mode != "sym")
    ws = random_weights(n, k, bits=kind.bits, group_size=kind.group_size, zero_mode=kind.zero_mode,
                        dtype=kind.dtype, copies=copies_for(qbytes, l2))
    dense = [(torch.randn(n, k, device="cuda") * 0.02).to(td) for _ in range(copies_for(2 * n * k, l2))]
    tiny, tiny_error, lite, lite_error = None, None, None, None
    if compare and kind.bits == 4:
        try:
            tiny = _tinygemm_weights(n, k, kind.group_size, copies_for(n * k // 2, l2))
        except Exception as exc:  # noqa: BLE001 - report why, keep benchmarking
            tiny_error = "tinygemm: " + _error(exc)
    if compare and kind.bits in GEMLITE_BITS:
        try:
            lite = _gemlite_layers(n, k, kind.bits, kind.group_size, td, copies_for(qbytes, l2))
        except Exception as exc:  # noqa: BLE001
            lite_error = "gemlite: " + _error(exc)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(td)
        y = torch.empty(m, n, device="cuda", dtype=td)
        t_mg = _timed(lambda i: matmul(x, ws[i % len(ws)], out=y), len(ws))
        t_fp = _timed(lambda i: torch.mm(x, dense[i % len(dense)].t(), out=y), len(dense))
        row = dict(label=label, n=n, k=k, m=m, schedule=explain(m, ws[0]).schedule,
                   us=t_mg * 1e6, fp16_us=t_fp * 1e6, speedup=t_fp / t_mg,
                   floor_share=(qbytes + 2 * m * (k + n)) / bandwidth / t_mg, tflops=2 * m * n * k / t_mg / 1e12)
        if tiny is not None:
            xb = x.to(torch.bfloat16)
            try:
                t_tg = _timed(lambda i: torch._weight_int4pack_mm(xb, tiny[i % len(tiny)][0], kind.group_size,
                                                                   tiny[i % len(tiny)][1]), len(tiny))
                row.update(tinygemm_us=t_tg * 1e6, tinygemm_speedup=t_fp / t_tg)
            except Exception as exc:  # noqa: BLE001
                tiny_error = "tinygemm: " + _error(exc)
        if lite is not None:
            try:
                t_gl = _timed(lambda i: lite[i % len(lite)](x), len(lite))
                row.update(gemlite_us=t_gl * 1e6, gemlite_speedup=t_fp / t_gl)
            except Exception as exc:  # noqa: BLE001
                lite_error = "gemlite: " + _error(exc)
        if tiny_error:
            row["tinygemm_error"] = tiny_error
        if lite_error:
            row["gemlite_error"] = lite_error
        rows.append(row)
    del ws, dense, tiny, lite
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
